//! Go: imports (named, dot and blank), cgo, and calls through them: `exec.Command` (its
//! command line analysed like a shell's), `os.StartProcess`, and the `os` functions that
//! write files. Go has no `eval`; `unsafe`, `syscall`, `plugin` and cgo are "cannot tell".

use std::collections::BTreeMap;

use tree_sitter::Node;

use crate::common::{self, Rule, Sink, Value, Word, check_write, pos, rule, text, walk};
use crate::{Category, Risk};

use Category::{DynamicEvaluation, NativeCode, Network, Subprocess};
use Risk::{High, Medium};

/// How deep nested expressions are followed before they count as unknown.
const MAX_DEPTH: u32 = 32;

/// Packages whose import is a finding (a rule covers its sub-packages).
static RULES: &[Rule] = &[
    rule("net", Network, Medium),
    rule("crypto/tls", Network, Medium),
    rule("golang.org/x/net", Network, Medium),
    rule("google.golang.org/grpc", Network, Medium),
    rule("github.com/gorilla/websocket", Network, Medium),
    rule("nhooyr.io/websocket", Network, Medium),
    rule("os/exec", Subprocess, Medium),
    rule("syscall", NativeCode, High),
    rule("unsafe", NativeCode, High),
    rule("plugin", NativeCode, High),
    rule("C", NativeCode, High),
    rule("runtime/cgo", NativeCode, High),
    rule("golang.org/x/sys/unix", NativeCode, High),
    rule("github.com/traefik/yaegi", DynamicEvaluation, High),
];

/// Packages under `net/` that parse or format and never open a connection.
const HARMLESS: &[&str] = &["net/url", "net/mail", "net/netip", "net/textproto"];

/// `os` functions that write to the path given as the argument at this index.
const PATH_FUNCS: &[(&str, usize)] = &[
    ("os.WriteFile", 0),
    ("os.Create", 0),
    ("os.Mkdir", 0),
    ("os.MkdirAll", 0),
    ("os.Remove", 0),
    ("os.RemoveAll", 0),
    ("os.Chmod", 0),
    ("os.Chown", 0),
    ("os.Lchown", 0),
    ("os.Truncate", 0),
    ("os.Rename", 1),
    ("os.Symlink", 1),
    ("os.Link", 1),
    ("io/ioutil.WriteFile", 0),
];

fn package_rule(path: &str) -> Option<Rule> {
    if HARMLESS.iter().any(|h| {
        path == *h
            || path
                .strip_prefix(h)
                .is_some_and(|r| r.starts_with(['/', '.']))
    }) {
        return None;
    }
    common::find_rule(RULES, path, &['/', '.'])
}

#[derive(Default)]
struct Names {
    /// Local package name → import path.
    aliases: BTreeMap<String, String>,
    /// Packages imported with `.`.
    dots: Vec<String>,
}

pub(crate) fn analyse(sink: &mut Sink, src: &str) {
    let Some(tree) = sink.parse(tree_sitter_go::LANGUAGE.into(), src) else {
        return;
    };
    let root = tree.root_node();
    sink.parse_errors |= root.has_error();
    let mut names = Names::default();
    walk(root, |node| {
        if node.kind() == "import_spec" {
            import(sink, &mut names, node, src);
        }
    });
    walk(root, |node| {
        if node.kind() == "call_expression" {
            call(sink, &names, node, src);
        }
    });
}

/// The name a package is used by when imported without one: the last path element, or the
/// one before a major-version suffix (`github.com/x/y/v2` is `y`).
fn default_name(path: &str) -> &str {
    let mut parts = path.rsplit('/');
    let last = parts.next().unwrap_or(path);
    let versioned =
        last.len() > 1 && last.starts_with('v') && last[1..].chars().all(|c| c.is_ascii_digit());
    if versioned {
        parts.next().unwrap_or(last)
    } else {
        last
    }
}

fn import(sink: &mut Sink, names: &mut Names, node: Node, src: &str) {
    let Some(path) = node
        .child_by_field_name("path")
        .and_then(|p| value(p, src, 0).literal().map(str::to_string))
    else {
        return;
    };
    let name = node.child_by_field_name("name");
    let how = match name.map(|n| (n.kind(), text(n, src))) {
        Some(("dot", _)) => {
            names.dots.push(path.clone());
            format!("imports `{path}` (as .)")
        }
        Some(("blank_identifier", _)) => format!("imports `{path}` (as _)"),
        Some((_, alias)) => {
            names.aliases.insert(alias.to_string(), path.clone());
            format!("imports `{path}` (as {alias})")
        }
        None => {
            names
                .aliases
                .insert(default_name(&path).to_string(), path.clone());
            format!("imports `{path}`")
        }
    };
    let how = if path == "C" {
        "uses cgo (`import \"C\"`)".to_string()
    } else {
        how
    };
    if let Some(r) = package_rule(&path) {
        sink.add(node, r.category, r.risk, how);
    }
}

fn value(node: Node, src: &str, depth: u32) -> Value {
    if depth > MAX_DEPTH {
        return Value::Dynamic;
    }
    match node.kind() {
        "interpreted_string_literal" => {
            let mut out = String::new();
            let mut cursor = node.walk();
            for child in node.named_children(&mut cursor) {
                match child.kind() {
                    "interpreted_string_literal_content" | "escape_sequence" => {
                        out.push_str(&common::unescape(text(child, src)))
                    }
                    _ => {}
                }
            }
            Value::Plain(out)
        }
        "raw_string_literal" => {
            let t = text(node, src);
            Value::Plain(
                t.get(1..t.len().saturating_sub(1))
                    .unwrap_or("")
                    .to_string(),
            )
        }
        "binary_expression" | "parenthesized_expression" => {
            Value::of_binary_or_paren(node, src, depth, value)
        }
        _ => Value::Dynamic,
    }
}

/// `exec.Command` → `os/exec.Command`; a bare name from a dot import likewise.
fn resolve(names: &Names, func: Node, src: &str) -> Option<String> {
    match func.kind() {
        "selector_expression" => {
            let operand = func.child_by_field_name("operand")?;
            let field = text(func.child_by_field_name("field")?, src);
            if operand.kind() != "identifier" {
                return None;
            }
            let pkg = names.aliases.get(text(operand, src))?;
            Some(format!("{pkg}.{field}"))
        }
        "identifier" => {
            let id = text(func, src);
            names.dots.iter().find_map(|d| {
                let full = format!("{d}.{id}");
                let known = full.starts_with("os/exec.")
                    || full == "os.StartProcess"
                    || full == "os.OpenFile"
                    || PATH_FUNCS.iter().any(|(n, _)| *n == full);
                known.then_some(full)
            })
        }
        "parenthesized_expression" => resolve(names, func.named_child(0)?, src),
        _ => None,
    }
}

fn call(sink: &mut Sink, names: &Names, node: Node, src: &str) {
    let Some(full) = node
        .child_by_field_name("function")
        .and_then(|f| resolve(names, f, src))
    else {
        return;
    };
    let args: Vec<Node> = match node.child_by_field_name("arguments") {
        Some(a) => {
            let mut cursor = a.walk();
            a.named_children(&mut cursor)
                .filter(|c| c.kind() != "comment")
                .collect()
        }
        None => Vec::new(),
    };
    let at = pos(node);
    let words = |from: usize| -> Vec<Word> {
        args.iter()
            .skip(from)
            .map(|a| Word::from_value(&value(*a, src, 0)))
            .collect()
    };
    match full.as_str() {
        "os/exec.Command" => common::program(sink, at, &words(0), "`exec.Command`"),
        "os/exec.CommandContext" => common::program(sink, at, &words(1), "`exec.CommandContext`"),
        "os.StartProcess" => {
            let argv: Vec<Word> = words(0).into_iter().take(1).collect();
            common::program(sink, at, &argv, "`os.StartProcess`");
        }
        "os.OpenFile" => {
            let writes = args.get(1).is_some_and(|f| {
                let f = text(*f, src);
                ["O_WRONLY", "O_RDWR", "O_CREATE", "O_APPEND", "O_TRUNC"]
                    .iter()
                    .any(|w| f.contains(w))
            });
            if writes && let Some(p) = args.first() {
                check_write(
                    sink,
                    at,
                    &value(*p, src, 0),
                    "`os.OpenFile` opens for writing",
                );
            }
        }
        f => {
            if let Some((_, i)) = PATH_FUNCS.iter().find(|(n, _)| *n == f)
                && let Some(p) = args.get(*i)
            {
                let short = f.rsplit('/').next().unwrap_or(f);
                check_write(sink, at, &value(*p, src, 0), &format!("`{short}` writes"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::tests::{check, check_none};

    #[test]
    fn imports() {
        check(
            "go",
            "package main\n\nimport (\n\t\"fmt\"\n\th \"net/http\"\n\t\"net/url\"\n\t\"os/exec\"\n\t\"unsafe\"\n\
             \t_ \"plugin\"\n\t\"net\"\n)\n\nfunc main() { fmt.Println(url.PathEscape(\"x\")) }\n",
            &[
                (5, "network", "imports `net/http` (as h)"),
                (7, "subprocess", "imports `os/exec`"),
                (8, "native_code", "imports `unsafe`"),
                (9, "native_code", "imports `plugin` (as _)"),
                (10, "network", "imports `net`"),
            ],
        );
    }

    #[test]
    fn cgo_and_syscall() {
        check(
            "go",
            "package main\n\n// #include <stdio.h>\nimport \"C\"\nimport \"syscall\"\n\nfunc main() {}\n",
            &[
                (4, "native_code", "uses cgo (`import \"C\"`)"),
                (5, "native_code", "imports `syscall`"),
            ],
        );
    }

    #[test]
    fn comments_and_strings_never_count() {
        check_none(
            "go",
            "package main\n\nimport \"fmt\"\n\n// import \"net/http\"\n/* exec.Command(\"curl\") */\n\
             func main() { fmt.Println(\"import \\\"os/exec\\\"\", `net/http`) }\n",
        );
    }

    #[test]
    fn commands() {
        check(
            "go",
            "package main\n\nimport (\n\tx \"os/exec\"\n\t\"context\"\n)\n\nfunc main() {\n\
             \tx.Command(\"ls\", \"-l\").Run()\n\tx.Command(\"curl\", \"https://x.invalid\").Run()\n\
             \tx.Command(name).Run()\n\tx.CommandContext(context.Background(), \"sh\", \"-c\", cmd).Run()\n\
             \tx.Command(\"pip\", \"install\", \"requests\").Run()\n}\n",
            &[
                (4, "subprocess", "imports `os/exec` (as x)"),
                (9, "subprocess", "runs `ls` (`exec.Command`)"),
                (10, "network", "runs `curl`"),
                (10, "subprocess", "runs `curl` (`exec.Command`)"),
                (
                    11,
                    "subprocess",
                    "runs a program named at run time (`exec.Command`)",
                ),
                (
                    12,
                    "dynamic_evaluation",
                    "`sh -c` runs a command built at run time",
                ),
                (12, "subprocess", "runs `sh` (`exec.CommandContext`)"),
                (13, "package_install", "runs `pip install`"),
                (13, "subprocess", "runs `pip` (`exec.Command`)"),
            ],
        );
    }

    #[test]
    fn file_writes() {
        check(
            "go",
            "package main\n\nimport (\n\t\"os\"\n\t\"io/ioutil\"\n)\n\nfunc main() {\n\
             \tos.WriteFile(\"/etc/x\", nil, 0644)\n\tos.WriteFile(\"out.txt\", nil, 0644)\n\
             \tos.OpenFile(\"/root/y\", os.O_CREATE|os.O_WRONLY, 0600)\n\tos.OpenFile(\"/etc/z\", os.O_RDONLY, 0)\n\
             \tioutil.WriteFile(`/usr/lib/k`, nil, 0644)\n\tos.Remove(\"/tmp/ok\")\n}\n",
            &[
                (
                    9,
                    "file_write_outside_workspace",
                    "`os.WriteFile` writes `/etc/x` outside the workspace",
                ),
                (
                    11,
                    "file_write_outside_workspace",
                    "`os.OpenFile` opens for writing `/root/y` outside the workspace",
                ),
                (
                    13,
                    "file_write_outside_workspace",
                    "`ioutil.WriteFile` writes `/usr/lib/k` outside the workspace",
                ),
            ],
        );
    }

    #[test]
    fn dot_imports() {
        check(
            "go",
            "package main\n\nimport . \"os/exec\"\n\nfunc main() { Command(\"wget\", \"x\").Run() }\n",
            &[
                (3, "subprocess", "imports `os/exec` (as .)"),
                (5, "network", "runs `wget`"),
                (5, "subprocess", "runs `wget` (`exec.Command`)"),
            ],
        );
    }
}
