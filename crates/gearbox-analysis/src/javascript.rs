//! JavaScript: ES imports, `require` (literal, or named at run time), dynamic `import()`,
//! destructuring (`const {exec: run} = require("child_process")`), globals (`fetch`, `eval`,
//! `Function`, `process.dlopen`) and calls resolved through all of these. `node:` prefixes
//! are dropped. Aliases are collected over the whole file regardless of scope or order.

use std::collections::{BTreeMap, BTreeSet};

use tree_sitter::Node;

use crate::common::{self, Rule, Sink, Value, Word, check_write, pos, rule, text, walk};
use crate::{Category, Risk};

use Category::{DynamicEvaluation, NativeCode, Network, PackageInstall, Subprocess};
use Risk::{High, Medium};

/// How deep nested expressions are followed before they count as unknown.
const MAX_DEPTH: u32 = 32;

/// Modules whose import is a finding (a rule covers `module/sub` and `module.member`).
static RULES: &[Rule] = &[
    rule("net", Network, Medium),
    rule("http", Network, Medium),
    rule("https", Network, Medium),
    rule("http2", Network, Medium),
    rule("dgram", Network, Medium),
    rule("tls", Network, Medium),
    rule("dns", Network, Medium),
    rule("axios", Network, Medium),
    rule("node-fetch", Network, Medium),
    rule("undici", Network, Medium),
    rule("got", Network, Medium),
    rule("request", Network, Medium),
    rule("superagent", Network, Medium),
    rule("needle", Network, Medium),
    rule("ky", Network, Medium),
    rule("cross-fetch", Network, Medium),
    rule("isomorphic-fetch", Network, Medium),
    rule("ws", Network, Medium),
    rule("socket.io-client", Network, Medium),
    rule("ssh2", Network, Medium),
    rule("nodemailer", Network, Medium),
    rule("child_process", Subprocess, Medium),
    rule("execa", Subprocess, Medium),
    rule("shelljs", Subprocess, Medium),
    rule("cross-spawn", Subprocess, Medium),
    rule("node-pty", Subprocess, Medium),
    rule("ffi-napi", NativeCode, High),
    rule("ffi", NativeCode, High),
    rule("node-ffi", NativeCode, High),
    rule("koffi", NativeCode, High),
    rule("ref-napi", NativeCode, High),
    rule("bindings", NativeCode, High),
    rule("node-gyp-build", NativeCode, High),
    rule("vm", DynamicEvaluation, High),
    rule("npm", PackageInstall, Medium),
    rule("pacote", PackageInstall, Medium),
    rule("live-plugin-manager", PackageInstall, Medium),
];

/// Globals the analysis follows; anything else unbound is unknown.
const GLOBALS: &[&str] = &[
    "eval",
    "Function",
    "fetch",
    "WebSocket",
    "XMLHttpRequest",
    "EventSource",
    "setTimeout",
    "setInterval",
    "process",
    "navigator",
    "Deno",
    "Bun",
];

/// Global functions and constructors that talk to the network.
const NETWORK_GLOBALS: &[&str] = &[
    "fetch",
    "WebSocket",
    "XMLHttpRequest",
    "EventSource",
    "navigator.sendBeacon",
    "Deno.connect",
    "Deno.connectTls",
    "Deno.listen",
    "Deno.serve",
    "Bun.connect",
    "Bun.listen",
    "Bun.serve",
];

const NATIVE_GLOBALS: &[&str] = &[
    "process.dlopen",
    "process.binding",
    "process._linkedBinding",
];

/// `fs` functions that write to the path given as the argument at this index.
const FS_FUNCS: &[(&str, usize)] = &[
    ("writeFile", 0),
    ("writeFileSync", 0),
    ("appendFile", 0),
    ("appendFileSync", 0),
    ("createWriteStream", 0),
    ("mkdir", 0),
    ("mkdirSync", 0),
    ("rm", 0),
    ("rmSync", 0),
    ("rmdir", 0),
    ("rmdirSync", 0),
    ("unlink", 0),
    ("unlinkSync", 0),
    ("chmod", 0),
    ("chmodSync", 0),
    ("truncate", 0),
    ("truncateSync", 0),
    ("rename", 1),
    ("renameSync", 1),
    ("copyFile", 1),
    ("copyFileSync", 1),
    ("cp", 1),
    ("cpSync", 1),
    ("symlink", 1),
    ("symlinkSync", 1),
    ("link", 1),
    ("linkSync", 1),
];

fn module_rule(name: &str) -> Option<Rule> {
    common::find_rule(RULES, name, &['.', '/'])
}

/// `node:fs/promises` → `fs`; `fs.promises.writeFile` → `fs.writeFile`.
fn normalise(name: &str) -> String {
    let name = name.strip_prefix("node:").unwrap_or(name);
    for p in ["fs/promises", "fs.promises"] {
        if name == p {
            return "fs".to_string();
        }
        if let Some(rest) = name.strip_prefix(p)
            && rest.starts_with('.')
        {
            return format!("fs{rest}");
        }
    }
    name.to_string()
}

#[derive(Default)]
struct Names {
    aliases: BTreeMap<String, String>,
}

pub(crate) fn analyse(sink: &mut Sink, src: &str) {
    let Some(tree) = sink.parse(tree_sitter_javascript::LANGUAGE.into(), src) else {
        return;
    };
    let root = tree.root_node();
    sink.parse_errors |= root.has_error();
    // One walk sorts out the nodes of interest; imports, then aliases, then calls.
    let (mut imports, mut bindings, mut uses) = (Vec::new(), Vec::new(), Vec::new());
    // `eval` and `Function` anywhere but as a callee (`Reflect.apply(eval, …)`, `[eval][0]`).
    let mut callees = BTreeSet::new();
    let mut values = Vec::new();
    walk(root, |node| match node.kind() {
        "import_statement" => imports.push(node),
        // `export * from "net"` loads the module too.
        "export_statement" if node.child_by_field_name("source").is_some() => imports.push(node),
        "variable_declarator" | "assignment_expression" => bindings.push(node),
        "call_expression" | "new_expression" | "subscript_expression" => {
            let callee = node
                .child_by_field_name("function")
                .or_else(|| node.child_by_field_name("constructor"));
            if let Some(c) = callee {
                callees.insert(c.id());
            }
            uses.push(node);
        }
        "identifier"
            if !callees.contains(&node.id()) && ["eval", "Function"].contains(&text(node, src)) =>
        {
            values.push(node)
        }
        _ => {}
    });
    let mut names = Names::default();
    for node in imports {
        import(sink, &mut names, node, src);
    }
    for _ in 0..2 {
        for node in &bindings {
            let (target, value) = if node.kind() == "variable_declarator" {
                ("name", "value")
            } else {
                ("left", "right")
            };
            bind(
                &mut names,
                node.child_by_field_name(target),
                node.child_by_field_name(value),
                src,
            );
        }
    }
    for node in uses {
        match node.kind() {
            "call_expression" => call(sink, &names, node, src, false),
            "new_expression" => call(sink, &names, node, src, true),
            _ => subscript(sink, &names, node, src),
        }
    }
    for node in values {
        let id = text(node, src);
        if !names.aliases.contains_key(id) {
            sink.add(
                node,
                DynamicEvaluation,
                High,
                format!("uses `{id}` as a value"),
            );
        }
    }
}

fn report_import(sink: &mut Sink, node: Node, module: &str, how: String) {
    let m = normalise(module);
    if m.ends_with(".node") {
        sink.add(node, NativeCode, High, format!("{how}: a native addon"));
    } else if let Some(r) = module_rule(&m) {
        sink.first_report(r.name);
        sink.add(node, r.category, r.risk, how);
    }
}

fn import(sink: &mut Sink, names: &mut Names, node: Node, src: &str) {
    let Some(source) = node.child_by_field_name("source") else {
        return;
    };
    let Some(module) = value(source, src, 0).literal().map(str::to_string) else {
        return;
    };
    let m = normalise(&module);
    let mut locals = Vec::new();
    let mut cursor = node.walk();
    for clause in node
        .named_children(&mut cursor)
        .filter(|c| c.kind() == "import_clause")
    {
        let mut cursor = clause.walk();
        for part in clause.named_children(&mut cursor) {
            match part.kind() {
                "identifier" => locals.push((text(part, src).to_string(), m.clone())),
                "namespace_import" => {
                    if let Some(id) = part.named_child(0) {
                        locals.push((text(id, src).to_string(), m.clone()));
                    }
                }
                "named_imports" => {
                    let mut cursor = part.walk();
                    for spec in part.named_children(&mut cursor) {
                        let (Some(name), alias) = (
                            spec.child_by_field_name("name"),
                            spec.child_by_field_name("alias"),
                        ) else {
                            continue;
                        };
                        let member = match value(name, src, 0).literal() {
                            Some(s) => s.to_string(),
                            None => text(name, src).to_string(),
                        };
                        let local = text(alias.unwrap_or(name), src).to_string();
                        locals.push((local, format!("{m}.{member}")));
                    }
                }
                _ => {}
            }
        }
    }
    let shown: Vec<&str> = locals.iter().map(|(l, _)| l.as_str()).collect();
    let how = if shown.is_empty() {
        format!("imports `{module}`")
    } else {
        format!("imports `{module}` (as {})", shown.join(", "))
    };
    report_import(sink, node, &module, how);
    names.aliases.extend(locals);
}

/// `const x = <known>`, `const {a, b: c} = <known>`.
fn bind(names: &mut Names, target: Option<Node>, value: Option<Node>, src: &str) {
    let (Some(target), Some(value)) = (target, value) else {
        return;
    };
    let Some(full) = resolve(names, value, src, 0) else {
        return;
    };
    match target.kind() {
        "identifier" => {
            names
                .aliases
                .entry(text(target, src).to_string())
                .or_insert(full);
        }
        "object_pattern" => {
            let mut cursor = target.walk();
            for p in target.named_children(&mut cursor) {
                let (key, local) = match p.kind() {
                    "shorthand_property_identifier_pattern" => (p, p),
                    "pair_pattern" => {
                        let (Some(k), Some(v)) =
                            (p.child_by_field_name("key"), p.child_by_field_name("value"))
                        else {
                            continue;
                        };
                        let v = if v.kind() == "assignment_pattern" {
                            match v.child_by_field_name("left") {
                                Some(l) => l,
                                None => continue,
                            }
                        } else {
                            v
                        };
                        (k, v)
                    }
                    "object_assignment_pattern" => match p.child_by_field_name("left") {
                        Some(l) => (l, l),
                        None => continue,
                    },
                    _ => continue,
                };
                if local.kind() != "identifier"
                    && local.kind() != "shorthand_property_identifier_pattern"
                {
                    continue;
                }
                let key = match value_of_key(key, src) {
                    Some(k) => k,
                    None => continue,
                };
                names
                    .aliases
                    .entry(text(local, src).to_string())
                    .or_insert(normalise(&format!("{full}.{key}")));
            }
        }
        _ => {}
    }
}

fn value_of_key(key: Node, src: &str) -> Option<String> {
    match key.kind() {
        "string" => value(key, src, 0).literal().map(str::to_string),
        "computed_property_name" => None,
        _ => Some(text(key, src).to_string()),
    }
}

/// The name an expression stands for (`cp.exec` → `child_process.exec`), if known.
fn resolve(names: &Names, node: Node, src: &str, depth: u32) -> Option<String> {
    if depth > MAX_DEPTH {
        return None;
    }
    let mut props = Vec::new();
    let mut n = node;
    let base = loop {
        if props.len() > MAX_DEPTH as usize {
            return None;
        }
        match n.kind() {
            "member_expression" => {
                props.push(text(n.child_by_field_name("property")?, src).to_string());
                n = n.child_by_field_name("object")?;
            }
            "subscript_expression" => {
                let index = n.child_by_field_name("index")?;
                props.push(value(index, src, 0).literal()?.to_string());
                n = n.child_by_field_name("object")?;
            }
            "parenthesized_expression" | "await_expression" => n = n.named_child(0)?,
            "identifier" => {
                let id = text(n, src);
                break match names.aliases.get(id) {
                    Some(full) => full.clone(),
                    None if ["globalThis", "window", "global", "self"].contains(&id) => {
                        "globalThis".to_string()
                    }
                    None if GLOBALS.contains(&id) => id.to_string(),
                    None => return None,
                };
            }
            "call_expression" => break required(names, n, src)?,
            _ => return None,
        }
    };
    let mut full = base;
    for p in props.iter().rev() {
        full.push('.');
        full.push_str(p);
    }
    let full = full
        .strip_prefix("globalThis.")
        .map(str::to_string)
        .unwrap_or(full);
    Some(normalise(&full))
}

/// `require`, `module.require`, `process.mainModule.require` (unless `require` is rebound).
fn is_require(names: &Names, func: Node, src: &str) -> bool {
    match func.kind() {
        "identifier" => text(func, src) == "require" && !names.aliases.contains_key("require"),
        "member_expression" => [
            "module.require",
            "process.mainModule.require",
            "globalThis.require",
        ]
        .contains(&text(func, src)),
        _ => false,
    }
}

/// The module a `require("x")` or `import("x")` call evaluates to.
fn required(names: &Names, call: Node, src: &str) -> Option<String> {
    let func = call.child_by_field_name("function")?;
    if func.kind() != "import" && !is_require(names, func, src) {
        return None;
    }
    let arg = arguments(call).into_iter().next()?;
    value(arg, src, 0).literal().map(normalise)
}

fn arguments(call: Node) -> Vec<Node> {
    let Some(args) = call.child_by_field_name("arguments") else {
        return Vec::new();
    };
    if args.kind() != "arguments" {
        return Vec::new();
    }
    let mut cursor = args.walk();
    args.named_children(&mut cursor)
        .filter(|a| a.kind() != "comment")
        .collect()
}

fn value(node: Node, src: &str, depth: u32) -> Value {
    if depth > MAX_DEPTH {
        return Value::Dynamic;
    }
    match node.kind() {
        "string" | "template_string" => {
            let mut out = String::new();
            let mut cursor = node.walk();
            for child in node.named_children(&mut cursor) {
                match child.kind() {
                    "string_fragment" | "escape_sequence" => {
                        out.push_str(&common::unescape(text(child, src)))
                    }
                    "template_substitution" => return Value::Dynamic,
                    _ => {}
                }
            }
            Value::Plain(out)
        }
        "binary_expression" | "parenthesized_expression" => {
            Value::of_binary_or_paren(node, src, depth, value)
        }
        _ => Value::Dynamic,
    }
}

fn array_words(node: Node, src: &str) -> Option<Vec<Word>> {
    if node.kind() != "array" {
        return None;
    }
    let mut cursor = node.walk();
    Some(
        node.named_children(&mut cursor)
            .filter(|c| c.kind() != "comment")
            .map(|c| Word::from_value(&value(c, src, 0)))
            .collect(),
    )
}

fn call(sink: &mut Sink, names: &Names, node: Node, src: &str, new: bool) {
    let field = if new { "constructor" } else { "function" };
    let Some(func) = node.child_by_field_name(field) else {
        return;
    };
    let args = arguments(node);
    let arg = |i: usize| args.get(i).copied();
    let at = pos(node);
    let is_require = is_require(names, func, src);
    if func.kind() == "import" || is_require {
        let how = if is_require { "requires" } else { "imports" };
        match arg(0).map(|a| value(a, src, 0)).unwrap_or(Value::Dynamic) {
            Value::Plain(m) => report_import(sink, node, &m, format!("{how} `{m}`")),
            Value::Folded(m) => {
                sink.add(
                    node,
                    DynamicEvaluation,
                    High,
                    format!("{how} a module whose name is built from pieces (`{m}`)"),
                );
                report_import(sink, node, &m, format!("{how} `{m}`"));
            }
            Value::Dynamic => sink.add(
                node,
                DynamicEvaluation,
                High,
                format!("{how} a module named at run time"),
            ),
        }
        return;
    }
    let Some(full) = resolve(names, func, src, 0) else {
        // `(() => {}).constructor("code")`, `this.constructor.constructor("code")`: the
        // Function constructor reached through any function.
        if func.kind() == "member_expression"
            && func
                .child_by_field_name("property")
                .is_some_and(|p| text(p, src) == "constructor")
        {
            sink.add(
                node,
                DynamicEvaluation,
                High,
                "calls a `constructor` (the `Function` constructor, reached through a function)"
                    .to_string(),
            );
        }
        return;
    };
    let f = full.as_str();
    match f {
        "eval" => {
            sink.add(node, DynamicEvaluation, High, "calls `eval`".to_string());
            if let Some(code) = arg(0).map(|a| value(a, src, 0))
                && let Some(code) = code.literal()
            {
                let code = code.to_string();
                sink.nested(at, "`eval`", |s| analyse(s, &code));
            }
        }
        "Function" => sink.add(
            node,
            DynamicEvaluation,
            High,
            format!(
                "{}`Function` from strings",
                if new { "creates a " } else { "calls " }
            ),
        ),
        "setTimeout" | "setInterval" => {
            if arg(0).is_some_and(|a| matches!(a.kind(), "string" | "template_string")) {
                sink.add(
                    node,
                    DynamicEvaluation,
                    High,
                    format!("`{f}` with a string of code"),
                );
            }
        }
        f if NETWORK_GLOBALS.contains(&f) => {
            sink.add(node, Network, Medium, format!("calls `{f}`"));
        }
        f if NATIVE_GLOBALS.contains(&f) => {
            sink.add(node, NativeCode, High, format!("calls `{f}`"));
        }
        "child_process.exec" | "child_process.execSync" | "shelljs.exec" => {
            let cmd = arg(0).map(|a| value(a, src, 0)).unwrap_or(Value::Dynamic);
            common::shell_string(sink, at, &cmd, &format!("`{f}`"));
        }
        "child_process.spawn"
        | "child_process.spawnSync"
        | "child_process.execFile"
        | "child_process.execFileSync"
        | "execa"
        | "execa.execa"
        | "execa.execaSync"
        | "cross-spawn"
        | "cross-spawn.sync"
        | "Deno.Command" => {
            let mut argv = vec![
                arg(0)
                    .map(|a| Word::from_value(&value(a, src, 0)))
                    .unwrap_or(Word::Dyn),
            ];
            if let Some(rest) = arg(1).and_then(|a| array_words(a, src)) {
                argv.extend(rest);
            }
            common::program(sink, at, &argv, &format!("`{f}`"));
        }
        "child_process.fork" => {
            let script = arg(0)
                .map(|a| Word::from_value(&value(a, src, 0)))
                .unwrap_or(Word::Dyn);
            common::program(
                sink,
                at,
                &[Word::Lit("node".into()), script],
                "`child_process.fork`",
            );
        }
        "Bun.spawn" | "Bun.spawnSync" => {
            let argv = arg(0)
                .and_then(|a| array_words(a, src))
                .unwrap_or_else(|| vec![Word::Dyn]);
            common::program(sink, at, &argv, &format!("`{f}`"));
        }
        f if f.starts_with("fs.") => fs_call(sink, node, f, &args, src),
        f => {
            if let Some(r) = module_rule(f)
                && sink.first_report(r.name)
            {
                sink.add(node, r.category, r.risk, format!("calls `{f}`"));
            }
        }
    }
}

fn fs_call(sink: &mut Sink, node: Node, f: &str, args: &[Node], src: &str) {
    let method = f.strip_prefix("fs.").unwrap_or(f);
    let at = pos(node);
    if method == "open" || method == "openSync" {
        let writes = args
            .get(1)
            .map(|m| value(*m, src, 0))
            .and_then(|m| m.literal().map(|m| m.contains(['w', 'a', '+'])))
            .unwrap_or(false);
        if writes && let Some(p) = args.first() {
            check_write(
                sink,
                at,
                &value(*p, src, 0),
                &format!("`{f}` opens for writing"),
            );
        }
        return;
    }
    if let Some((_, i)) = FS_FUNCS.iter().find(|(n, _)| *n == method)
        && let Some(p) = args.get(*i)
    {
        check_write(sink, at, &value(*p, src, 0), &format!("`{f}` writes"));
    }
}

/// `globalThis[name]`, `child_process[name]` with a name built at run time.
fn subscript(sink: &mut Sink, names: &Names, node: Node, src: &str) {
    let (Some(obj), Some(index)) = (
        node.child_by_field_name("object"),
        node.child_by_field_name("index"),
    ) else {
        return;
    };
    if value(index, src, 0) != Value::Dynamic {
        return;
    }
    let Some(obj) = (match obj.kind() {
        "identifier" if ["globalThis", "window", "global", "self"].contains(&text(obj, src)) => {
            Some("globalThis".to_string())
        }
        _ => resolve(names, obj, src, 0),
    }) else {
        return;
    };
    if obj == "globalThis" || (module_rule(&obj).is_some() && !obj.contains('.')) {
        sink.add(
            node,
            DynamicEvaluation,
            High,
            format!("looks up a property of `{obj}` named at run time"),
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::tests::{check, check_none};

    #[test]
    fn requires_and_imports() {
        check(
            "javascript",
            "const cp = require(\"child_process\");\nimport net from \"node:net\";\n\
             import * as h from 'https';\nimport { readFile } from 'fs';\nconst path = require('path');\n",
            &[
                (1, "subprocess", "requires `child_process`"),
                (2, "network", "imports `node:net` (as net)"),
                (3, "network", "imports `https` (as h)"),
            ],
        );
    }

    #[test]
    fn comments_and_strings_never_count() {
        check_none(
            "javascript",
            "// require(\"net\")\n/* eval(x) */\nconsole.log('require(\"child_process\")');\n\
             const s = `fetch(${1})`;\n",
        );
    }

    #[test]
    fn destructured_exec() {
        check(
            "javascript",
            "const {exec, spawn: run} = require(\"child_process\");\nexec('curl x.invalid');\n\
             run('ls', ['-l']);\nexec(cmd);\n",
            &[
                (1, "subprocess", "requires `child_process`"),
                (2, "network", "`child_process.exec`: runs `curl`"),
                (
                    2,
                    "subprocess",
                    "runs shell command `curl x.invalid` (`child_process.exec`)",
                ),
                (3, "subprocess", "runs `ls` (`child_process.spawn`)"),
                (
                    4,
                    "dynamic_evaluation",
                    "runs a shell command built at run time (`child_process.exec`)",
                ),
            ],
        );
    }

    #[test]
    fn dynamic_imports_and_requires() {
        check(
            "javascript",
            "const m = await import(x);\nconst n = await import('node:dgram');\nrequire(name);\n\
             require('chi' + 'ld_process').execSync('ls');\n",
            &[
                (
                    1,
                    "dynamic_evaluation",
                    "imports a module named at run time",
                ),
                (2, "network", "imports `node:dgram`"),
                (
                    3,
                    "dynamic_evaluation",
                    "requires a module named at run time",
                ),
                (
                    4,
                    "dynamic_evaluation",
                    "requires a module whose name is built from pieces (`child_process`)",
                ),
                (4, "subprocess", "requires `child_process`"),
                (
                    4,
                    "subprocess",
                    "runs shell command `ls` (`child_process.execSync`)",
                ),
            ],
        );
    }

    #[test]
    fn globals() {
        check(
            "javascript",
            "const r = await fetch('https://x.invalid');\nnew Function('return 1')();\neval(code);\n\
             globalThis.eval('2');\nglobalThis[k]();\nsetTimeout('alert(1)', 10);\nsetTimeout(() => 1, 10);\n\
             process.dlopen(m, '/tmp/x.node');\n",
            &[
                (1, "network", "calls `fetch`"),
                (2, "dynamic_evaluation", "creates a `Function` from strings"),
                (3, "dynamic_evaluation", "calls `eval`"),
                (4, "dynamic_evaluation", "calls `eval`"),
                (
                    5,
                    "dynamic_evaluation",
                    "looks up a property of `globalThis` named at run time",
                ),
                (
                    6,
                    "dynamic_evaluation",
                    "`setTimeout` with a string of code",
                ),
                (8, "native_code", "calls `process.dlopen`"),
            ],
        );
    }

    #[test]
    fn fs_writes() {
        check(
            "javascript",
            "const fs = require('fs');\nfs.writeFileSync('/etc/x', 'y');\nfs.writeFileSync('out.txt', 'y');\n\
             import { writeFile } from 'node:fs/promises';\nawait writeFile('/root/.ssh/k', 'z');\n\
             fs.promises.appendFile('/var/log/x', 'a');\nfs.openSync('/etc/y', 'w');\nfs.openSync('/etc/z');\n",
            &[
                (
                    2,
                    "file_write_outside_workspace",
                    "`fs.writeFileSync` writes `/etc/x` outside the workspace",
                ),
                (
                    5,
                    "file_write_outside_workspace",
                    "`fs.writeFile` writes `/root/.ssh/k` outside the workspace",
                ),
                (
                    6,
                    "file_write_outside_workspace",
                    "`fs.appendFile` writes `/var/log/x` outside the workspace",
                ),
                (
                    7,
                    "file_write_outside_workspace",
                    "`fs.openSync` opens for writing `/etc/y` outside the workspace",
                ),
            ],
        );
    }

    #[test]
    fn native_addons_and_vm() {
        check(
            "javascript",
            "const addon = require('./build/Release/addon.node');\nconst vm = require('vm');\n\
             import ffi from 'ffi-napi';\n",
            &[
                (
                    1,
                    "native_code",
                    "requires `./build/Release/addon.node`: a native addon",
                ),
                (2, "dynamic_evaluation", "requires `vm`"),
                (3, "native_code", "imports `ffi-napi` (as ffi)"),
            ],
        );
    }

    #[test]
    fn template_literals_without_substitutions_are_literals() {
        check(
            "javascript",
            "const cp = require(`child_process`);\nconst m = require(`${base}/x`);\n",
            &[
                (1, "subprocess", "requires `child_process`"),
                (
                    2,
                    "dynamic_evaluation",
                    "requires a module named at run time",
                ),
            ],
        );
    }

    #[test]
    fn other_ways_to_require_and_evaluate() {
        check(
            "javascript",
            "module.require('net');\nprocess.mainModule.require('child_process');\n\
             this.constructor.constructor('return process')();\n(() => {}).constructor('x')();\n",
            &[
                (1, "network", "requires `net`"),
                (2, "subprocess", "requires `child_process`"),
                (
                    3,
                    "dynamic_evaluation",
                    "calls a `constructor` (the `Function` constructor, reached through a function)",
                ),
                (
                    4,
                    "dynamic_evaluation",
                    "calls a `constructor` (the `Function` constructor, reached through a function)",
                ),
            ],
        );
    }

    #[test]
    fn evaluators_as_values() {
        check(
            "javascript",
            "Reflect.apply(eval, null, ['1']);\nconst F = Function;\nobj.eval(1);\neval('2');\n",
            &[
                (1, "dynamic_evaluation", "uses `eval` as a value"),
                (2, "dynamic_evaluation", "uses `Function` as a value"),
                (4, "dynamic_evaluation", "calls `eval`"),
            ],
        );
    }

    #[test]
    fn re_exports_load_the_module() {
        check(
            "javascript",
            "export * from 'node:net';\nexport { exec } from 'child_process';\nexport const x = 1;\n",
            &[
                (1, "network", "imports `node:net`"),
                (2, "subprocess", "imports `child_process`"),
            ],
        );
    }

    #[test]
    fn chained_require_call() {
        check(
            "javascript",
            "require('child_process').spawnSync('npm', ['install', 'left-pad']);\n",
            &[
                (1, "package_install", "runs `npm install`"),
                (1, "subprocess", "requires `child_process`"),
                (1, "subprocess", "runs `npm` (`child_process.spawnSync`)"),
            ],
        );
    }
}
