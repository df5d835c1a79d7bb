//! docs/MCP.md stays true to the server: every profile, every tool any profile lists and
//! every resource template appears in it, in backticks. The names come from the code (the
//! profile type's schema, [`tools::tools_for`], the template lists), so a new tool, profile or
//! template fails this test until the document describes it.

use std::collections::BTreeSet;
use std::str::FromStr;

use gearbox_engine::config::ToolProfile;
use serde_json::Value;

use crate::tools;

/// Every string value the schema allows: `const` and `enum` entries at any depth.
fn allowed_strings(v: &Value, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(map) => {
            if let Some(Value::String(s)) = map.get("const") {
                out.insert(s.clone());
            }
            if let Some(Value::Array(items)) = map.get("enum") {
                out.extend(items.iter().filter_map(Value::as_str).map(String::from));
            }
            map.values().for_each(|x| allowed_strings(x, out));
        }
        Value::Array(items) => items.iter().for_each(|x| allowed_strings(x, out)),
        _ => {}
    }
}

/// Every profile, as the configuration's schema names them.
pub(crate) fn all_profiles() -> Vec<ToolProfile> {
    let schema =
        serde_json::to_value(schemars::schema_for!(ToolProfile)).expect("profile schema as JSON");
    let mut names = BTreeSet::new();
    allowed_strings(&schema, &mut names);
    let profiles: Vec<ToolProfile> = names
        .iter()
        .map(|n| ToolProfile::from_str(n).expect("a schema value is a profile name"))
        .collect();
    assert!(
        profiles.contains(&ToolProfile::Default),
        "the schema of ToolProfile lists no profiles: {schema}"
    );
    profiles
}

#[test]
fn mcp_md_names_every_profile_tool_and_template() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/MCP.md");
    let doc = std::fs::read_to_string(path).expect("read docs/MCP.md");

    let profiles = all_profiles();
    let mut names: BTreeSet<String> = profiles.iter().map(|p| p.as_str().to_string()).collect();
    names.extend(
        tools::tools_for(&profiles)
            .iter()
            .map(|(_, t)| t.name.to_string()),
    );
    names.extend(
        crate::resources::templates()
            .into_iter()
            .chain(crate::sessions::templates())
            .map(|t| t.uri_template),
    );

    let missing: Vec<&String> = names
        .iter()
        .filter(|n| !doc.contains(&format!("`{n}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/MCP.md does not name these in backticks: {missing:?}"
    );
}
