//! What every language analyser shares: the finding sink, the tree walk, the workspace path
//! rule, and the analysis of a command line (argv), which Bash uses for every command and the
//! other languages for the programs they start. Code nested in a command line (`sh -c '…'`,
//! `python3 -c '…'`) goes back to the language analysers through the sink's [`Analysers`],
//! which the dispatch (`analyze.rs`) sets.

use std::collections::BTreeSet;
use std::time::Instant;

use tree_sitter::{Language, Node, ParseOptions, ParseState, Parser, Tree};

use crate::{Category, Finding, Risk};

/// How deep strings handed to a shell or an interpreter are parsed in turn
/// (`os.system("bash -c 'python3 -c …'")`). Deeper strings count as dynamic evaluation.
const MAX_NESTING: u8 = 4;

/// How long a quoted snippet in a finding may be, in characters.
const SNIPPET_CHARS: usize = 60;

/// A language whose code can be nested in a string of another's (`python3 -c '…'`,
/// `sh -c '…'`, `node -e '…'`) and is then parsed in turn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum NestedLang {
    Python,
    JavaScript,
    Bash,
}

/// The language analysers as the command-line analysis here reaches them: it parses code
/// nested in strings and looks up Python's module rules, but the analysers use this module,
/// so it cannot name them. The dispatch hands them to every [`Sink`].
pub(crate) struct Analysers {
    /// Analyses `src`, handed to `lang`'s interpreter, into the sink.
    pub nested: fn(NestedLang, &mut Sink, &str),
    /// The rule of a Python module (`python3 -m <module>`).
    pub python_module: fn(&str) -> Option<Rule>,
}

/// Collects the findings of one file.
pub(crate) struct Sink<'f> {
    file: &'f str,
    analysers: &'static Analysers,
    pub findings: Vec<Finding>,
    pub parse_errors: bool,
    /// Parsing was cancelled at the deadline.
    pub timed_out: bool,
    deadline: Instant,
    /// While analysing a string nested in other code: where that string is, and what runs it.
    nested: Option<((u32, u32), String)>,
    depth: u8,
    /// Module rules already reported in this file, so that a call through a module reported
    /// at its import is not reported again.
    reported: BTreeSet<&'static str>,
}

impl<'f> Sink<'f> {
    pub fn new(file: &'f str, deadline: Instant, analysers: &'static Analysers) -> Sink<'f> {
        Sink {
            file,
            analysers,
            findings: Vec::new(),
            parse_errors: false,
            timed_out: false,
            deadline,
            nested: None,
            depth: 0,
            reported: BTreeSet::new(),
        }
    }

    pub fn add(&mut self, node: Node, category: Category, risk: Risk, what: String) {
        self.add_at(pos(node), category, risk, what);
    }

    pub fn add_at(&mut self, at: (u32, u32), category: Category, risk: Risk, what: String) {
        let ((line, column), what) = match &self.nested {
            Some((outer, by)) => (*outer, format!("{by}: {what}")),
            None => (at, what),
        };
        self.findings.push(Finding {
            file: self.file.to_string(),
            line,
            column,
            category,
            capability: category.capability(),
            what,
            risk,
        });
    }

    /// Parses `src`. `None` when the parser could not be set up (noted as a parse error) or
    /// the analysis ran out of time (noted in `timed_out`).
    pub fn parse(&mut self, language: Language, src: &str) -> Option<Tree> {
        // One parser per thread, reused: making and freeing one per parse cost a few µs of
        // every call (docs/ANALYSIS.md). A parse the deadline cancelled would otherwise resume
        // where it stopped; `reset` (and `set_language`, which resets too) starts afresh.
        thread_local! {
            static PARSER: std::cell::RefCell<Parser> = std::cell::RefCell::new(Parser::new());
        }
        let deadline = self.deadline;
        let mut past_deadline = |_: &ParseState| Instant::now() > deadline;
        let bytes = src.as_bytes();
        let tree = PARSER.with_borrow_mut(|parser| {
            parser.reset();
            if parser.set_language(&language).is_err() {
                return Err(());
            }
            Ok(parser.parse_with_options(
                &mut |i, _| bytes.get(i..).unwrap_or(&[]),
                None,
                Some(ParseOptions::new().progress_callback(&mut past_deadline)),
            ))
        });
        let Ok(tree) = tree else {
            self.parse_errors = true;
            return None;
        };
        if tree.is_none() {
            self.timed_out = true;
        }
        tree
    }

    /// Marks a module rule reported; false if it already was.
    pub fn first_report(&mut self, rule: &'static str) -> bool {
        self.reported.insert(rule)
    }

    /// Analyses `src` as `lang` code (call it inside [`Sink::nested`]).
    pub fn analyse_nested(&mut self, lang: NestedLang, src: &str) {
        (self.analysers.nested)(lang, self, src);
    }

    /// Runs `f` for a string found at `at` that `by` hands to another analyser. Returns false
    /// (and runs nothing) when strings are nested too deeply to follow.
    pub fn nested(&mut self, at: (u32, u32), by: &str, f: impl FnOnce(&mut Sink)) -> bool {
        if self.depth >= MAX_NESTING {
            return false;
        }
        let saved = self.nested.clone();
        let by = match &saved {
            Some((_, outer)) => format!("{outer}: {by}"),
            None => by.to_string(),
        };
        let at = saved.as_ref().map(|(outer, _)| *outer).unwrap_or(at);
        self.nested = Some((at, by));
        self.depth += 1;
        let errors = self.parse_errors;
        f(self);
        // A string that is not valid code is the program's problem, not unparsed program code.
        self.parse_errors = errors;
        self.depth -= 1;
        self.nested = saved;
        true
    }
}

/// 1-based (line, column) of a node.
pub(crate) fn pos(node: Node) -> (u32, u32) {
    let p = node.start_position();
    (
        u32::try_from(p.row).unwrap_or(u32::MAX).saturating_add(1),
        u32::try_from(p.column)
            .unwrap_or(u32::MAX)
            .saturating_add(1),
    )
}

/// Visits every node under `root` (itself included) in document order, without recursion,
/// so deeply nested code cannot exhaust the stack.
pub(crate) fn walk<'t>(root: Node<'t>, mut f: impl FnMut(Node<'t>)) {
    let mut cursor = root.walk();
    loop {
        f(cursor.node());
        if cursor.goto_first_child() {
            continue;
        }
        loop {
            if cursor.goto_next_sibling() {
                break;
            }
            if !cursor.goto_parent() {
                return;
            }
        }
    }
}

pub(crate) fn text<'s>(node: Node, src: &'s str) -> &'s str {
    node.utf8_text(src.as_bytes()).unwrap_or("")
}

/// A snippet of code or a string for a finding's text: one line, at most [`SNIPPET_CHARS`].
pub(crate) fn snippet(s: &str) -> String {
    let one_line: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() > SNIPPET_CHARS {
        let cut: String = one_line.chars().take(SNIPPET_CHARS).collect();
        format!("{cut}…")
    } else {
        one_line
    }
}

/// The value of an expression, as far as it is known without running anything.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    /// A plain string literal.
    Plain(String),
    /// A string built from literals (`"so" + "cket"`): known, but built on purpose.
    Folded(String),
    /// Anything else: only known at run time.
    Dynamic,
}

impl Value {
    pub fn literal(&self) -> Option<&str> {
        match self {
            Value::Plain(s) | Value::Folded(s) => Some(s),
            Value::Dynamic => None,
        }
    }

    /// `a + b`.
    pub fn concat(a: Value, b: Value) -> Value {
        match (a.literal(), b.literal()) {
            (Some(x), Some(y)) => Value::Folded(format!("{x}{y}")),
            _ => Value::Dynamic,
        }
    }

    /// The value of a binary expression (only `+` folds) or a parenthesized one, with the
    /// language's own evaluator for the operands. Every grammar names the fields `left`,
    /// `operator` and `right`.
    pub fn of_binary_or_paren(
        node: Node,
        src: &str,
        depth: u32,
        value: fn(Node, &str, u32) -> Value,
    ) -> Value {
        if node.kind() == "parenthesized_expression" {
            return match node.named_child(0) {
                Some(inner) => value(inner, src, depth + 1),
                None => Value::Dynamic,
            };
        }
        let op = node.child_by_field_name("operator").map(|o| o.kind());
        match (
            op,
            node.child_by_field_name("left"),
            node.child_by_field_name("right"),
        ) {
            (Some("+"), Some(l), Some(r)) => {
                Value::concat(value(l, src, depth + 1), value(r, src, depth + 1))
            }
            _ => Value::Dynamic,
        }
    }
}

/// Unescapes the common backslash escapes of a quoted string (enough for the names and
/// paths the analysis looks at).
pub(crate) fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some('0') => out.push('\0'),
            Some('\n') => {}
            Some(c @ ('\\' | '\'' | '"' | '`' | '$' | '/')) => out.push(c),
            Some(c) => {
                out.push('\\');
                out.push(c);
            }
            None => out.push('\\'),
        }
    }
    out
}

/// Whether a literal path lies outside the places a run may write to: the workspace
/// (`/work`, where relative paths start), `/tmp`, and the standard streams. `~` is the
/// home directory, which is outside.
pub(crate) fn outside_workspace(path: &str) -> bool {
    if path.is_empty() {
        return false;
    }
    if path.starts_with('~') {
        return true;
    }
    let joined = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/work/{path}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in joined.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    let normal = format!("/{}", parts.join("/"));
    let inside = ["/work", "/tmp", "/dev/fd", "/proc/self/fd"]
        .iter()
        .any(|root| normal == *root || normal.starts_with(&format!("{root}/")))
        || ["/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty"].contains(&normal.as_str());
    !inside
}

/// Adds a file-write finding when `path` is a literal outside the workspace.
pub(crate) fn check_write(sink: &mut Sink, at: (u32, u32), path: &Value, how: &str) {
    if let Some(p) = path.literal()
        && outside_workspace(p)
    {
        sink.add_at(
            at,
            Category::FileWriteOutsideWorkspace,
            Risk::Medium,
            format!("{how} `{}` outside the workspace", snippet(p)),
        );
    }
}

/// One word of a command line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Word {
    Lit(String),
    Dyn,
}

impl Word {
    pub fn from_value(v: &Value) -> Word {
        match v.literal() {
            Some(s) => Word::Lit(s.to_string()),
            None => Word::Dyn,
        }
    }
    fn lit(&self) -> Option<&str> {
        match self {
            Word::Lit(s) => Some(s),
            Word::Dyn => None,
        }
    }
}

/// Commands that talk to the network.
const NETWORK_COMMANDS: &[&str] = &[
    "curl",
    "wget",
    "nc",
    "ncat",
    "netcat",
    "socat",
    "ssh",
    "scp",
    "sftp",
    "rsync",
    "telnet",
    "ftp",
    "tftp",
    "ping",
    "ping6",
    "dig",
    "nslookup",
    "host",
    "aria2c",
    "http",
    "https",
    "lynx",
    "links",
    "w3m",
    "nmap",
    "traceroute",
    "whois",
    "mosh",
    "openssl",
    "xh",
];

/// Package managers and the subcommands that install.
const INSTALLERS: &[(&str, &[&str])] = &[
    ("pip", &["install", "download"]),
    ("pip3", &["install", "download"]),
    ("pipx", &["install", "run"]),
    ("uv", &["add", "pip", "tool", "run"]),
    ("uvx", &[]),
    ("poetry", &["add", "install"]),
    ("pipenv", &["install"]),
    ("conda", &["install", "create"]),
    ("mamba", &["install", "create"]),
    ("easy_install", &[]),
    (
        "npm",
        &[
            "install", "i", "ci", "add", "exec", "update", "in", "isntall",
        ],
    ),
    ("pnpm", &["install", "i", "add", "dlx"]),
    ("yarn", &["add", "install", "dlx"]),
    ("bun", &["install", "i", "add", "x"]),
    ("npx", &[]),
    ("bunx", &[]),
    ("apt", &["install"]),
    ("apt-get", &["install", "build-dep", "source"]),
    ("aptitude", &["install"]),
    ("dpkg", &["-i", "--install"]),
    ("apk", &["add"]),
    ("dnf", &["install"]),
    ("yum", &["install"]),
    ("zypper", &["install", "in"]),
    ("pacman", &["-S", "-U", "-Sy", "-Syu"]),
    ("brew", &["install"]),
    ("gem", &["install"]),
    ("cargo", &["install", "add"]),
    ("go", &["get", "install"]),
    ("composer", &["require", "install"]),
    ("cpan", &[]),
    ("cpanm", &[]),
];

const SHELLS: &[&str] = &["sh", "bash", "dash", "zsh", "ksh", "ash", "fish", "busybox"];

/// Interpreters whose `-c`/`-e` code this crate can parse, and the language.
const INTERPRETERS: &[(&str, &str, NestedLang)] = &[
    ("python", "-c", NestedLang::Python),
    ("python3", "-c", NestedLang::Python),
    ("python2", "-c", NestedLang::Python),
    ("node", "-e", NestedLang::JavaScript),
    ("nodejs", "-e", NestedLang::JavaScript),
    ("deno", "eval", NestedLang::JavaScript),
];

/// Interpreters whose inline code this crate cannot parse.
const OTHER_INTERPRETERS: &[(&str, &str)] = &[
    ("perl", "-e"),
    ("ruby", "-e"),
    ("php", "-r"),
    ("lua", "-e"),
    ("awk", ""),
    ("osascript", "-e"),
];

/// Commands that write to the paths they are given.
const WRITERS: &[(&str, &str)] = &[
    ("tee", "all"),
    ("touch", "all"),
    ("mkdir", "all"),
    ("rm", "all"),
    ("rmdir", "all"),
    ("truncate", "all"),
    ("chmod", "all"),
    ("chown", "all"),
    ("cp", "last"),
    ("mv", "last"),
    ("ln", "last"),
    ("install", "last"),
];

fn basename(s: &str) -> &str {
    s.rsplit('/').next().unwrap_or(s)
}

/// Drops the wrappers that run the rest of the line as a command (`sudo`, `env A=b`,
/// `nohup`, `timeout 5`, `xargs -0`), returning the real command line.
fn unwrap_command(mut argv: &[Word]) -> &[Word] {
    for _ in 0..8 {
        let Some(Word::Lit(first)) = argv.first() else {
            return argv;
        };
        let takes_value: &[&str] = match basename(first) {
            "sudo" | "doas" => &["-u", "-g", "-C", "-h", "-p", "-U", "-r", "-t"],
            "env" => &["-u", "-C", "-S"],
            "nice" => &["-n"],
            "timeout" => &["-s", "-k", "--signal", "--kill-after"],
            "xargs" => &["-I", "-n", "-P", "-d", "-L", "-s", "-E", "-a"],
            "stdbuf" | "ionice" | "chrt" | "taskset" => &["-c", "-n", "-p"],
            "nohup" | "time" | "command" | "exec" | "builtin" | "setsid" | "unbuffer"
            | "strace" | "ltrace" | "watch" | "caffeinate" | "fakeroot" => &[],
            _ => return argv,
        };
        let wrapper = basename(first).to_string();
        // `command -v curl` only asks where `curl` is.
        if wrapper == "command"
            && argv
                .iter()
                .skip(1)
                .any(|w| matches!(w.lit(), Some("-v" | "-V")))
        {
            return &[];
        }
        let mut i = 1;
        while let Some(w) = argv.get(i) {
            match w.lit() {
                Some(a) if takes_value.contains(&a) => i += 2,
                Some(a) if a.starts_with('-') => i += 1,
                Some(a) if wrapper == "env" && a.contains('=') => i += 1,
                Some(a) if wrapper == "timeout" && a.starts_with(|c: char| c.is_ascii_digit()) => {
                    i += 1
                }
                _ => break,
            }
        }
        argv = argv.get(i..).unwrap_or(&[]);
    }
    argv
}

/// How a command gets its standard input, for shells and interpreters that read their
/// program from it.
#[derive(Clone, PartialEq)]
pub(crate) enum Stdin {
    /// The terminal or the run's own input.
    Plain,
    /// Another command's output (`curl … | sh`), or a here-string built at run time.
    Piped,
    /// A here-document or here-string known before the run.
    Here(String),
}

/// Analyses one command line. `at` is where it is; `stdin` how it is fed. Plain commands
/// produce nothing; see the crate docs for what does.
pub(crate) fn command(sink: &mut Sink, at: (u32, u32), argv: &[Word], stdin: Stdin) {
    let stdin = &stdin;
    let argv = unwrap_command(argv);
    let Some(first) = argv.first() else {
        return;
    };
    let Some(prog) = first.lit() else {
        sink.add_at(
            at,
            Category::DynamicEvaluation,
            Risk::High,
            "runs a command whose name is only known at run time".to_string(),
        );
        return;
    };
    let name = basename(prog);
    let name = name.strip_suffix(".exe").unwrap_or(name);
    let args = &argv[1..];
    let lits: Vec<Option<&str>> = args.iter().map(Word::lit).collect();
    // The first argument that is not an option.
    let subcommand = lits.iter().flatten().find(|a| !a.starts_with('-')).copied();

    if NETWORK_COMMANDS.contains(&name) {
        sink.add_at(
            at,
            Category::Network,
            Risk::Medium,
            format!("runs `{name}`"),
        );
    }
    if name == "git"
        && let Some(sub) = subcommand
        && [
            "clone",
            "fetch",
            "pull",
            "push",
            "ls-remote",
            "submodule",
            "remote",
        ]
        .contains(&sub)
    {
        sink.add_at(
            at,
            Category::Network,
            Risk::Medium,
            format!("runs `git {sub}`"),
        );
    }
    if let Some((_, subs)) = INSTALLERS.iter().find(|(n, _)| *n == name) {
        let installs = if subs.is_empty() {
            Some(name.to_string())
        } else {
            lits.iter()
                .flatten()
                .find(|a| subs.contains(a))
                .map(|sub| format!("{name} {sub}"))
        };
        if let Some(what) = installs {
            sink.add_at(
                at,
                Category::PackageInstall,
                Risk::Medium,
                format!("runs `{what}`"),
            );
        }
    }
    let python = name.starts_with("python");
    if python
        && let Some(m) = lits.iter().position(|a| *a == Some("-m"))
        && let Some(Some(module)) = lits.get(m + 1)
    {
        if *module == "pip" || *module == "ensurepip" {
            if lits
                .iter()
                .flatten()
                .any(|a| *a == "install" || *module == "ensurepip")
            {
                sink.add_at(
                    at,
                    Category::PackageInstall,
                    Risk::Medium,
                    format!("runs `{name} -m {module} install`"),
                );
            }
        } else if let Some(rule) = (sink.analysers.python_module)(module) {
            sink.add_at(
                at,
                rule.category,
                rule.risk,
                format!("runs `{name} -m {module}`"),
            );
        }
    }
    if name == "eval" {
        sink.add_at(
            at,
            Category::DynamicEvaluation,
            Risk::High,
            "runs `eval`".to_string(),
        );
    }
    if (name == "source" || name == ".") && matches!(args.first(), Some(Word::Dyn)) {
        sink.add_at(
            at,
            Category::DynamicEvaluation,
            Risk::High,
            format!("`{name}` of a file named at run time"),
        );
    }
    if SHELLS.contains(&name) {
        shell(sink, at, name, args, stdin);
    }
    if let Some((_, flag, lang)) = INTERPRETERS.iter().find(|(n, _, _)| *n == name) {
        interpreter(sink, at, name, args, flag, *lang, stdin);
    }
    if let Some((_, flag)) = OTHER_INTERPRETERS.iter().find(|(n, _)| *n == name)
        && (flag.is_empty() || lits.contains(&Some(flag)))
        && name != "awk"
    {
        sink.add_at(
            at,
            Category::DynamicEvaluation,
            Risk::High,
            format!("runs `{name}` code that is not analysed"),
        );
    }
    if let Some((_, which)) = WRITERS.iter().find(|(n, _)| *n == name) {
        let paths: Vec<&Word> = args
            .iter()
            .filter(|w| !w.lit().is_some_and(|a| a.starts_with('-')))
            .collect();
        let targets: Vec<&Word> = if *which == "last" {
            paths.last().copied().into_iter().collect()
        } else {
            paths
        };
        for t in targets {
            if let Word::Lit(p) = t {
                check_write(
                    sink,
                    at,
                    &Value::Plain(p.clone()),
                    &format!("`{name}` writes"),
                );
            }
        }
    }
    if name == "dd" {
        for a in lits.iter().flatten() {
            if let Some(p) = a.strip_prefix("of=") {
                check_write(sink, at, &Value::Plain(p.to_string()), "`dd` writes");
            }
        }
    }
}

/// `sh -c '…'`, `bash script.sh`, `… | bash`.
fn shell(sink: &mut Sink, at: (u32, u32), name: &str, args: &[Word], stdin: &Stdin) {
    let mut i = 0;
    // busybox sh …
    if name == "busybox" {
        match args.first().and_then(Word::lit) {
            Some(s) if SHELLS.contains(&s) => i = 1,
            _ => return,
        }
    }
    while let Some(w) = args.get(i) {
        match w {
            Word::Lit(a)
                if a == "-c" || (a.starts_with('-') && a.ends_with('c') && a.len() <= 4) =>
            {
                match args.get(i + 1) {
                    Some(Word::Lit(code)) => {
                        let code = code.clone();
                        let by = format!("`{name} -c`");
                        if !sink.nested(at, &by, |s| s.analyse_nested(NestedLang::Bash, &code)) {
                            too_deep(sink, at);
                        }
                    }
                    _ => sink.add_at(
                        at,
                        Category::DynamicEvaluation,
                        Risk::High,
                        format!("`{name} -c` runs a command built at run time"),
                    ),
                }
                return;
            }
            Word::Lit(a) if a == "-s" || a == "-" => break,
            Word::Lit(a) if a.starts_with('-') || a.starts_with('+') => i += 1,
            // A script file: literal ones are files of the submission, analysed on their own.
            Word::Lit(_) => return,
            Word::Dyn => {
                sink.add_at(
                    at,
                    Category::DynamicEvaluation,
                    Risk::High,
                    format!("`{name}` runs a script named at run time"),
                );
                return;
            }
        }
    }
    stdin_code(sink, at, name, NestedLang::Bash, stdin);
}

/// A shell or interpreter that reads its program from standard input.
fn stdin_code(sink: &mut Sink, at: (u32, u32), name: &str, lang: NestedLang, stdin: &Stdin) {
    match stdin {
        Stdin::Plain => {}
        Stdin::Piped => sink.add_at(
            at,
            Category::DynamicEvaluation,
            Risk::High,
            format!("`{name}` runs what it reads from a pipe"),
        ),
        Stdin::Here(code) => {
            let code = code.clone();
            let ok = sink.nested(at, &format!("`{name}` reads"), |s| {
                s.analyse_nested(lang, &code)
            });
            if !ok {
                too_deep(sink, at);
            }
        }
    }
}

/// `python3 -c '…'`, `node -e '…'`, `… | python3`.
fn interpreter(
    sink: &mut Sink,
    at: (u32, u32),
    name: &str,
    args: &[Word],
    flag: &str,
    lang: NestedLang,
    stdin: &Stdin,
) {
    let mut i = 0;
    while let Some(w) = args.get(i) {
        match w {
            Word::Lit(a) if a == flag || (flag == "-e" && (a == "-p" || a == "--eval")) => {
                match args.get(i + 1) {
                    Some(Word::Lit(code)) => {
                        let code = code.clone();
                        let by = format!("`{name} {a}`");
                        let ok = sink.nested(at, &by, |s| s.analyse_nested(lang, &code));
                        if !ok {
                            too_deep(sink, at);
                        }
                    }
                    _ => sink.add_at(
                        at,
                        Category::DynamicEvaluation,
                        Risk::High,
                        format!("`{name} {a}` runs code built at run time"),
                    ),
                }
                return;
            }
            // `python3 -m x`: handled by the caller.
            Word::Lit(a) if a == "-m" => return,
            Word::Lit(a) if a == "-" => break,
            Word::Lit(a) if a.starts_with('-') => i += 1,
            Word::Lit(_) => return,
            Word::Dyn => {
                sink.add_at(
                    at,
                    Category::DynamicEvaluation,
                    Risk::High,
                    format!("`{name}` runs a script named at run time"),
                );
                return;
            }
        }
    }
    stdin_code(sink, at, name, lang, stdin);
}

fn too_deep(sink: &mut Sink, at: (u32, u32)) {
    sink.add_at(
        at,
        Category::DynamicEvaluation,
        Risk::High,
        "code nested in strings too deeply to analyse".to_string(),
    );
}

/// A program started by non-shell code (`subprocess.run`, `spawn`, `exec.Command`): a
/// subprocess finding, then the command line's own findings.
pub(crate) fn program(sink: &mut Sink, at: (u32, u32), argv: &[Word], via: &str) {
    match unwrap_command(argv).first() {
        Some(Word::Lit(p)) => sink.add_at(
            at,
            Category::Subprocess,
            Risk::Medium,
            format!("runs `{}` ({via})", snippet(p)),
        ),
        _ => {
            sink.add_at(
                at,
                Category::Subprocess,
                Risk::High,
                format!("runs a program named at run time ({via})"),
            );
            return;
        }
    }
    command(sink, at, argv, Stdin::Plain);
}

/// A shell command string run by non-shell code (`os.system`, `child_process.exec`).
pub(crate) fn shell_string(sink: &mut Sink, at: (u32, u32), cmd: &Value, via: &str) {
    match cmd.literal() {
        Some(code) => {
            sink.add_at(
                at,
                Category::Subprocess,
                Risk::Medium,
                format!("runs shell command `{}` ({via})", snippet(code)),
            );
            let code = code.to_string();
            if !sink.nested(at, via, |s| s.analyse_nested(NestedLang::Bash, &code)) {
                too_deep(sink, at);
            }
        }
        None => sink.add_at(
            at,
            Category::DynamicEvaluation,
            Risk::High,
            format!("runs a shell command built at run time ({via})"),
        ),
    }
}

/// A module-level rule: a module (and everything under it) whose import is a finding.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rule {
    pub name: &'static str,
    pub category: Category,
    pub risk: Risk,
}

pub(crate) const fn rule(name: &'static str, category: Category, risk: Risk) -> Rule {
    Rule {
        name,
        category,
        risk,
    }
}

/// The rule for `name` (a module, or something inside one): the longest rule that is `name`
/// or a prefix of it followed by one of `seps`.
pub(crate) fn find_rule(rules: &'static [Rule], name: &str, seps: &[char]) -> Option<Rule> {
    rules
        .iter()
        .filter(|r| {
            name == r.name
                || name
                    .strip_prefix(r.name)
                    .is_some_and(|rest| rest.starts_with(seps))
        })
        .max_by_key(|r| r.name.len())
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Analysers that find nothing, for sinks that parse one file.
    static NO_ANALYSERS: Analysers = Analysers {
        nested: |_, _, _| {},
        python_module: |_| None,
    };

    #[test]
    fn workspace_paths() {
        for inside in [
            "out.txt",
            "./a/b",
            "/work/x",
            "/tmp/x",
            "/dev/null",
            "/work",
            "a/../b",
            "/dev/stderr",
        ] {
            assert!(!outside_workspace(inside), "{inside}");
        }
        for outside in [
            "/etc/passwd",
            "../x",
            "/work/../etc/x",
            "~/.bashrc",
            "/workspace/x",
            "/tmpx",
            "/",
            "a/../../../root/x",
        ] {
            assert!(outside_workspace(outside), "{outside}");
        }
    }

    #[test]
    fn wrappers_are_unwrapped() {
        let w = |s: &str| Word::Lit(s.to_string());
        let argv = [
            w("sudo"),
            w("-u"),
            w("root"),
            w("env"),
            w("A=b"),
            w("curl"),
            w("x"),
        ];
        assert_eq!(unwrap_command(&argv), &[w("curl"), w("x")]);
        let argv = [w("timeout"), w("5"), w("wget")];
        assert_eq!(unwrap_command(&argv), &[w("wget")]);
        let argv = [w("command"), w("-v"), w("curl")];
        assert!(unwrap_command(&argv).is_empty());
    }

    #[test]
    fn parsing_stops_at_the_deadline() {
        let src = "x = [1, 2, 3]\n".repeat(10_000);
        let deadline = Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let mut sink = Sink::new("main.py", deadline, &NO_ANALYSERS);
        assert!(
            sink.parse(tree_sitter_python::LANGUAGE.into(), &src)
                .is_none()
        );
        assert!(sink.timed_out);
        // The thread's parser is reused: the next parse starts afresh, not where the
        // cancelled one stopped.
        let mut sink = Sink::new(
            "main.py",
            Instant::now() + std::time::Duration::from_secs(60),
            &NO_ANALYSERS,
        );
        let small = "y = 2\n";
        let tree = sink.parse(tree_sitter_python::LANGUAGE.into(), small);
        let root = tree.as_ref().map(|t| t.root_node());
        assert_eq!(
            root.map(|r| (r.end_byte(), r.has_error())),
            Some((small.len(), false))
        );
        assert_eq!(root.map(|r| r.child_count()), Some(1));
        let mut sink = Sink::new(
            "main.py",
            Instant::now() + std::time::Duration::from_secs(60),
            &NO_ANALYSERS,
        );
        assert!(
            sink.parse(tree_sitter_python::LANGUAGE.into(), &src)
                .is_some()
        );
        assert!(!sink.timed_out);
    }

    #[test]
    fn snippets_are_short_and_one_line() {
        assert_eq!(snippet("a\n  b"), "a b");
        assert_eq!(snippet(&"x".repeat(100)).chars().count(), SNIPPET_CHARS + 1);
    }
}
