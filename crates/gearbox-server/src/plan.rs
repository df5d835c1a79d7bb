//! The plan of one call's run: what every step of the request pipeline settled, carried whole
//! to the sandbox, and into a pending approval, so a run resumed by `approval_status` is the
//! same run (its session, its tools) as the one a human approved.
//!
//! The pipeline (`GearboxServer::call`): parse the arguments, prepare the request, attach the
//! session, check the tool access, gate it (analysis, gear, approval), open the tool channel
//! (after the gear), guard it (audit, limiter), execute, shape the result.

use gearbox_core::{BackendKind, ExecRequest};

use crate::broker::ToolAccess;
use crate::sessions::SessionRun;

/// One call's run, as planned.
#[derive(Debug, Clone)]
pub struct RunPlan {
    /// What runs, and under which limits and capabilities.
    pub request: ExecRequest,
    /// The backend the call asked for (`None`: the configured one).
    pub backend: Option<BackendKind>,
    /// The session whose workspace the run uses.
    pub session: Option<SessionRun>,
    /// The downstream tools the run may call (the channel is not open yet).
    pub tools: Option<ToolAccess>,
}

impl RunPlan {
    /// What an approval binds to besides the request: the tools' spec.
    pub fn tools_spec(&self) -> Option<&str> {
        self.tools.as_ref().map(|t| t.spec.as_str())
    }
}
