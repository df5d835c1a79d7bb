//! Typed stubs: one Python module (`tools/<server>.py`) or CommonJS module
//! (`tools/<server>.js`) per server, a function per tool with its description and argument
//! schema as the docstring, so a model reads a few lines per tool instead of every schema.
//!
//! Names: a server or tool name becomes an identifier by replacing every character outside
//! `[A-Za-z0-9_]` with `_`, prefixing `_` when it starts with a digit and appending `_` to a
//! reserved word (`everything/get-sum` is `tools.everything.get_sum`); a clash gets `_2`,
//! `_3`, ... The call itself always uses the real names.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use rmcp::model::Tool;
use serde_json::{Map, Value};

/// Language of the generated stubs.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum StubLanguage {
    Python,
    Javascript,
}

impl StubLanguage {
    /// The file a stub module is written to, relative to the SDK directory.
    pub fn file_name(self, server: &str) -> String {
        match self {
            StubLanguage::Python => format!("tools/{}.py", identifier(server, PY_RESERVED)),
            StubLanguage::Javascript => format!("tools/{}.js", identifier(server, JS_RESERVED)),
        }
    }
}

const PY_RESERVED: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield", "match", "case", "type", "_args", "_call",
];

const JS_RESERVED: &[&str] = &[
    "break",
    "case",
    "catch",
    "class",
    "const",
    "continue",
    "debugger",
    "default",
    "delete",
    "do",
    "else",
    "enum",
    "export",
    "extends",
    "false",
    "finally",
    "for",
    "function",
    "if",
    "import",
    "in",
    "instanceof",
    "new",
    "null",
    "return",
    "super",
    "switch",
    "this",
    "throw",
    "true",
    "try",
    "typeof",
    "var",
    "void",
    "while",
    "with",
    "yield",
    "let",
    "static",
    "implements",
    "interface",
    "package",
    "private",
    "protected",
    "public",
    "await",
    "arguments",
    "eval",
    "callTool",
    "module",
    "exports",
    "require",
];

/// `name` as an identifier of the language whose reserved words are `reserved`.
pub fn identifier(name: &str, reserved: &[&str]) -> String {
    let mut id: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if id.is_empty() || id.starts_with(|c: char| c.is_ascii_digit()) {
        id.insert(0, '_');
    }
    if reserved.contains(&id.as_str()) {
        id.push('_');
    }
    id
}

fn unique(base: String, used: &mut BTreeSet<String>) -> String {
    let mut name = base.clone();
    let mut n = 2;
    while !used.insert(name.clone()) {
        name = format!("{base}_{n}");
        n += 1;
    }
    name
}

/// A string literal valid in both Python and JavaScript.
fn lit(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// A short type of a JSON Schema: `str`, `list[int]`, `Literal['a', 'b']`, ...
fn py_type(schema: &Value) -> String {
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        let items: Vec<String> = values.iter().map(|v| v.to_string()).collect();
        return format!("Literal[{}]", items.join(", "));
    }
    match schema.get("type") {
        Some(Value::String(t)) => match t.as_str() {
            "string" => "str".into(),
            "integer" => "int".into(),
            "number" => "float".into(),
            "boolean" => "bool".into(),
            "object" => "dict".into(),
            "null" => "None".into(),
            "array" => match schema.get("items") {
                Some(items) => format!("list[{}]", py_type(items)),
                None => "list".into(),
            },
            _ => "Any".into(),
        },
        Some(Value::Array(ts)) => {
            let parts: Vec<String> = ts
                .iter()
                .map(|t| py_type(&serde_json::json!({ "type": t })))
                .collect();
            parts.join(" | ")
        }
        _ => "Any".into(),
    }
}

fn js_type(schema: &Value) -> String {
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        let items: Vec<String> = values.iter().map(|v| v.to_string()).collect();
        return format!("({})", items.join("|"));
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("string") => "string".into(),
        Some("integer") | Some("number") => "number".into(),
        Some("boolean") => "boolean".into(),
        Some("object") => "object".into(),
        Some("array") => match schema.get("items") {
            Some(items) => format!("Array<{}>", js_type(items)),
            None => "Array<any>".into(),
        },
        _ => "any".into(),
    }
}

struct Param {
    key: String,
    ident: String,
    schema: Value,
    required: bool,
}

fn params(tool: &Tool, reserved: &[&str]) -> Vec<Param> {
    let schema = Value::Object(tool.input_schema.as_ref().clone());
    let required: BTreeSet<String> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| {
            r.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let empty = Map::new();
    let props = schema
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let mut used = BTreeSet::new();
    let mut out: Vec<Param> = props
        .iter()
        .map(|(k, v)| Param {
            key: k.clone(),
            ident: unique(identifier(k, reserved), &mut used),
            schema: v.clone(),
            required: required.contains(k),
        })
        .collect();
    out.sort_by_key(|p| !p.required);
    out
}

/// One line of a parameter's documentation: description, allowed values, default, bounds.
fn param_doc(p: &Param) -> String {
    let mut parts = Vec::new();
    if let Some(d) = p.schema.get("description").and_then(Value::as_str) {
        parts.push(d.trim().to_string());
    }
    if let Some(d) = p.schema.get("default") {
        parts.push(format!("default {d}"));
    }
    for (k, label) in [("minimum", "min"), ("maximum", "max")] {
        if let Some(v) = p.schema.get(k) {
            parts.push(format!("{label} {v}"));
        }
    }
    parts.join("; ")
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn output_doc(tool: &Tool) -> Option<String> {
    tool.output_schema
        .as_ref()
        .map(|s| serde_json::to_string(&Value::Object(s.as_ref().clone())).unwrap_or_default())
}

/// The Python module of `server`'s tools.
pub fn python(server: &str, tools: &[Tool]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\"\"\"Tools of the MCP server {server:?}, generated by gearbox.\n\nEach function calls \
         gearbox.call_tool({server:?}, TOOL, {{...}}) and returns its structured content, \
         else its text;\nfailures raise gearbox.ToolError subclasses.\n\"\"\"\n\
         from typing import Any, Literal\n\nfrom gearbox import call_tool as _call\n\n\n\
         def _args(values, required):\n    return {{k: v for k, v in values.items() if v is \
         not None or k in required}}\n"
    );
    let mut used = BTreeSet::new();
    for tool in tools {
        let name = unique(identifier(&tool.name, PY_RESERVED), &mut used);
        let ps = params(tool, PY_RESERVED);
        let mut sig = Vec::new();
        for p in &ps {
            let t = py_type(&p.schema);
            if p.required {
                sig.push(format!("{}: {t}", p.ident));
            } else {
                sig.push(format!("{}: {t} | None = None", p.ident));
            }
        }
        let sig = if sig.is_empty() {
            String::new()
        } else {
            format!("*, {}", sig.join(", "))
        };
        let mut doc = String::new();
        let desc = tool.description.as_deref().unwrap_or("").trim();
        doc.push_str(if desc.is_empty() {
            "(no description)"
        } else {
            desc
        });
        if !ps.is_empty() {
            doc.push_str("\n\nArgs:");
            for p in &ps {
                let _ = write!(
                    doc,
                    "\n    {} ({}{}): {}",
                    p.ident,
                    py_type(&p.schema),
                    if p.required { ", required" } else { "" },
                    one_line(&param_doc(p))
                );
                if p.ident != p.key {
                    let _ = write!(doc, " [sent as {:?}]", p.key);
                }
            }
        }
        if let Some(o) = output_doc(tool) {
            let _ = write!(doc, "\n\nReturns structured content matching: {o}");
        }
        let doc = doc.replace('\\', "\\\\").replace("\"\"\"", "\\\"\\\"\\\"");
        let values: Vec<String> = ps
            .iter()
            .map(|p| format!("{}: {}", lit(&p.key), p.ident))
            .collect();
        let required: Vec<String> = ps
            .iter()
            .filter(|p| p.required)
            .map(|p| format!("{}, ", lit(&p.key)))
            .collect();
        let _ = writeln!(
            out,
            "\ndef {name}({sig}) -> Any:\n    \"\"\"{doc}\n    \"\"\"\n    return _call({}, {}, \
             _args({{{}}}, ({})))\n",
            lit(server),
            lit(&tool.name),
            values.join(", "),
            required.concat()
        );
    }
    out
}

/// The CommonJS module of `server`'s tools: async functions taking one object of arguments.
pub fn javascript(server: &str, tools: &[Tool]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "// Tools of the MCP server {server:?}, generated by gearbox. Each function calls\n\
         // callTool({server:?}, TOOL, args) and resolves to its structured content, else its\n\
         // text; failures reject with gearbox ToolError subclasses.\n\"use strict\";\n\
         const {{ callTool }} = require(\"gearbox\");\n"
    );
    let mut used = BTreeSet::new();
    let mut names = Vec::new();
    for tool in tools {
        let name = unique(identifier(&tool.name, JS_RESERVED), &mut used);
        let ps = params(tool, JS_RESERVED);
        let mut doc = String::from("/**\n");
        let desc = tool
            .description
            .as_deref()
            .unwrap_or("(no description)")
            .trim();
        for line in desc.lines() {
            let _ = writeln!(doc, " * {}", line.replace("*/", "*\\/"));
        }
        doc.push_str(" * @param {object} [args]\n");
        for p in &ps {
            let key = if p.key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                p.key.clone()
            } else {
                lit(&p.key)
            };
            let field = if p.required { key } else { format!("[{key}]") };
            let _ = writeln!(
                doc,
                " * @param {{{}}} args.{} - {}",
                js_type(&p.schema),
                field,
                one_line(&param_doc(p)).replace("*/", "*\\/")
            );
        }
        match output_doc(tool) {
            Some(o) => {
                let _ = writeln!(
                    doc,
                    " * @returns {{Promise<object>}} structured content matching: {}",
                    o.replace("*/", "*\\/")
                );
            }
            None => doc.push_str(" * @returns {Promise<any>}\n"),
        }
        doc.push_str(" */");
        let _ = writeln!(
            out,
            "{doc}\nasync function {name}(args = {{}}) {{\n  return callTool({}, {}, args);\n}}\n",
            lit(server),
            lit(&tool.name)
        );
        names.push(name);
    }
    let _ = writeln!(out, "module.exports = {{ {} }};", names.join(", "));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn tool(name: &str, schema: Value) -> Tool {
        let Value::Object(map) = schema else {
            return Tool::new(name.to_string(), "d", Arc::new(Map::new()));
        };
        Tool::new(
            name.to_string(),
            "Adds \"\"\" two */ numbers",
            Arc::new(map),
        )
    }

    #[test]
    fn identifiers_are_safe() {
        assert_eq!(identifier("get-sum", PY_RESERVED), "get_sum");
        assert_eq!(identifier("2fa", PY_RESERVED), "_2fa");
        assert_eq!(identifier("class", PY_RESERVED), "class_");
        assert_eq!(identifier("a.b c", JS_RESERVED), "a_b_c");
        assert_eq!(StubLanguage::Python.file_name("my-srv"), "tools/my_srv.py");
    }

    #[test]
    fn python_stub_has_keyword_args_and_escaped_docs() {
        let t = tool(
            "get-sum",
            serde_json::json!({"type":"object","properties":{
                "a":{"type":"number","description":"First"},
                "from":{"type":"string","enum":["x","y"]}},
                "required":["a"]}),
        );
        let py = python("everything", &[t]);
        assert!(
            py.contains("def get_sum(*, a: float, from_: Literal[\"x\", \"y\"] | None = None)"),
            "{py}"
        );
        assert!(
            py.contains(
                "_call(\"everything\", \"get-sum\", _args({\"a\": a, \"from\": from_}, (\"a\", )))"
            ),
            "{py}"
        );
        assert!(!py.contains("Adds \"\"\" two"), "{py}");
        let js = javascript("everything", &[tool("get-sum", serde_json::json!({}))]);
        assert!(js.contains("async function get_sum(args = {})"), "{js}");
        assert!(js.contains("two *\\/ numbers"), "{js}");
        assert!(js.contains("module.exports = { get_sum };"), "{js}");
    }
}
