//! Tool schemas in the form clients check fastest and read most widely, meaning unchanged.
//!
//! schemars writes a documented Rust enum as `oneOf` of one `const` per variant and every
//! named type once under `$defs`, referenced by `$ref`. Both are valid 2020-12, but both cost
//! every client on every call: the official Python SDK validates each result against the
//! tool's output schema with `jsonschema`, which evaluates each `oneOf` branch and resolves
//! each `$ref` through its registry (~165 µs per `execute_code` result), and checks the schema
//! against the 2020-12 metaschema once per session (~19 ms). Some model providers' schema
//! dialects also refuse `$ref` or `oneOf` in tool schemas. [`compact`] rewrites a schema into
//! one that accepts exactly the same documents:
//! - a `oneOf` whose branches are each a string `const` (with at most a type, title and
//!   description) becomes `"type": "string", "enum": [...]`, each variant's description
//!   kept as a line of the node's description;
//! - every `$ref` into the schema's own `$defs` is replaced by what it names, its sibling
//!   keywords merged in when they are annotations or agree; a recursive reference, a
//!   conflicting sibling or a reference elsewhere stays as it is, with the definitions it
//!   needs;
//! - an optional value, `anyOf` of one schema of a single type and `{"type": "null"}`
//!   (schemars' `Option` of a named type), becomes that schema with `null` added to its
//!   `type` (and to its `enum`), when every other keyword of it applies to its type alone.
//!
//! [`without_nulls`] then takes `null` out of input schemas, which changes what they accept
//! (an explicit `null` for an optional argument, which the server still takes).
//!
//! `bench`: the same result validates in ~90 µs and the schema is checked in ~13 ms
//! (docs/PERFORMANCE.md).

use serde_json::{Map, Value};

/// Keywords that say something about a value without constraining it: on a `$ref`'s node
/// they may override what the definition says.
const ANNOTATIONS: &[&str] = &[
    "title",
    "description",
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
];

/// Rewrite `schema` (a tool's input or output schema) as described in the module's docs.
pub(crate) fn compact(schema: &mut Value) {
    let Some(root) = schema.as_object_mut() else {
        return;
    };
    let defs = match root.remove("$defs") {
        Some(Value::Object(defs)) => defs,
        Some(other) => {
            root.insert("$defs".into(), other);
            Map::new()
        }
        None => Map::new(),
    };
    let mut needed = Vec::new();
    inline(schema, &defs, &mut Vec::new(), &mut needed);
    // Definitions still referenced (recursion, conflicts), each compacted the same way.
    let mut kept = Map::new();
    while let Some(name) = needed.pop() {
        if kept.contains_key(&name) {
            continue;
        }
        let Some(def) = defs.get(&name) else {
            continue;
        };
        let mut def = def.clone();
        inline(&mut def, &defs, &mut vec![name.clone()], &mut needed);
        kept.insert(name, def);
    }
    enums(schema);
    nullables(schema);
    if !kept.is_empty() {
        let mut kept = Value::Object(kept);
        enums(&mut kept);
        nullables(&mut kept);
        if let Some(root) = schema.as_object_mut() {
            root.insert("$defs".into(), kept);
        }
    }
}

/// The definition a local reference names (`#/$defs/Name`).
fn local_def(reference: &str) -> Option<&str> {
    reference
        .strip_prefix("#/$defs/")
        .filter(|name| !name.contains('/') && !name.contains('~'))
}

/// Replace every `$ref` beneath `v` that can be inlined; `inside`: the definitions being
/// inlined around `v` (a reference to one of them is recursion); `needed`: the definitions
/// still referenced.
fn inline(
    v: &mut Value,
    defs: &Map<String, Value>,
    inside: &mut Vec<String>,
    needed: &mut Vec<String>,
) {
    match v {
        Value::Object(map) => {
            let local = match map.get("$ref") {
                Some(Value::String(reference)) => local_def(reference).map(str::to_string),
                _ => None,
            };
            if let Some(name) = local {
                match expand(map, &name, defs, inside, needed) {
                    Some(replacement) => {
                        *v = replacement;
                        return;
                    }
                    None => needed.push(name),
                }
            }
            for value in map.values_mut() {
                inline(value, defs, inside, needed);
            }
        }
        Value::Array(items) => {
            for item in items {
                inline(item, defs, inside, needed);
            }
        }
        _ => {}
    }
}

/// What the node `map` (`{"$ref": "#/$defs/<name>", siblings...}`) becomes, if it can be
/// inlined: the definition, itself inlined, with the siblings merged in.
fn expand(
    map: &Map<String, Value>,
    name: &str,
    defs: &Map<String, Value>,
    inside: &mut Vec<String>,
    needed: &mut Vec<String>,
) -> Option<Value> {
    if inside.iter().any(|n| n == name) {
        return None;
    }
    let Value::Object(def) = defs.get(name)? else {
        return None;
    };
    // Validation keywords on both sides would have to hold together (`$ref` beside other
    // keywords is an implicit `allOf`); merging is exact only when they agree.
    let conflict = map.iter().any(|(k, v)| {
        k != "$ref" && !ANNOTATIONS.contains(&k.as_str()) && def.get(k).is_some_and(|d| d != v)
    });
    if conflict || def.contains_key("$ref") && map.len() > 1 {
        return None;
    }
    let mut merged = Value::Object(def.clone());
    inside.push(name.to_string());
    inline(&mut merged, defs, inside, needed);
    inside.pop();
    let Value::Object(mut merged) = merged else {
        return None;
    };
    for (k, v) in map {
        if k != "$ref" {
            merged.insert(k.clone(), v.clone());
        }
    }
    Some(Value::Object(merged))
}

/// Turn every `oneOf` of string constants beneath `v` into an `enum`.
fn enums(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for value in map.values_mut() {
                enums(value);
            }
            let Some(Value::Array(branches)) = map.get("oneOf") else {
                return;
            };
            let mut values = Vec::new();
            let mut lines = Vec::new();
            for branch in branches {
                let Value::Object(b) = branch else { return };
                let Some(Value::String(value)) = b.get("const") else {
                    return;
                };
                let plain = b.iter().all(|(k, v)| match k.as_str() {
                    "const" | "title" | "description" => true,
                    "type" => v == "string",
                    _ => false,
                });
                if !plain || values.contains(value) {
                    return;
                }
                if let Some(Value::String(d)) = b.get("description") {
                    lines.push(format!("- `{value}`: {d}"));
                }
                values.push(value.clone());
            }
            if values.is_empty() || map.get("type").is_some_and(|t| t != "string") {
                return;
            }
            map.remove("oneOf");
            map.insert("type".into(), Value::String("string".into()));
            map.insert(
                "enum".into(),
                Value::Array(values.into_iter().map(Value::String).collect()),
            );
            if !lines.is_empty() {
                let text = match map.get("description") {
                    Some(Value::String(d)) => format!("{d}\n{}", lines.join("\n")),
                    _ => lines.join("\n"),
                };
                map.insert("description".into(), Value::String(text));
            }
        }
        Value::Array(items) => items.iter_mut().for_each(enums),
        _ => {}
    }
}

/// Keywords that constrain only values of one type: on a schema of that type they let a
/// `null` through unchanged.
fn only_for(ty: &str) -> &'static [&'static str] {
    match ty {
        "object" => &[
            "properties",
            "required",
            "additionalProperties",
            "patternProperties",
            "propertyNames",
            "minProperties",
            "maxProperties",
            "dependentRequired",
            "dependentSchemas",
            "unevaluatedProperties",
        ],
        "array" => &[
            "items",
            "prefixItems",
            "contains",
            "minContains",
            "maxContains",
            "minItems",
            "maxItems",
            "uniqueItems",
            "unevaluatedItems",
        ],
        "string" => &["minLength", "maxLength", "pattern", "format"],
        "integer" | "number" => &[
            "minimum",
            "maximum",
            "exclusiveMinimum",
            "exclusiveMaximum",
            "multipleOf",
        ],
        _ => &[],
    }
}

/// Turn every `anyOf: [S, {"type": "null"}]` beneath `v` (either order) into S accepting
/// `null` too, where that is exact: S has one `type` and, besides annotations and `enum`,
/// only keywords of that type; the node has nothing but the `anyOf` and annotations.
fn nullables(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for value in map.values_mut() {
                nullables(value);
            }
            let Some(mut merged) = nullable(map) else {
                return;
            };
            map.remove("anyOf");
            // Both descriptions are kept, the node's (a property's) first; of other
            // annotations, the node's win.
            match (map.get("description"), merged.remove("description")) {
                (Some(Value::String(mine)), Some(Value::String(theirs))) if *mine != theirs => {
                    let both = format!("{mine}\n{theirs}");
                    map.insert("description".into(), Value::String(both));
                }
                (None, Some(theirs)) => {
                    map.insert("description".into(), theirs);
                }
                _ => {}
            }
            for (k, v) in merged {
                map.entry(k).or_insert(v);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(nullables),
        _ => {}
    }
}

/// What `map`'s `anyOf` of a schema and `null` becomes, if it can be merged (see
/// [`nullables`]).
fn nullable(map: &Map<String, Value>) -> Option<Map<String, Value>> {
    let Some(Value::Array(branches)) = map.get("anyOf") else {
        return None;
    };
    if branches.len() != 2
        || map
            .keys()
            .any(|k| k != "anyOf" && !ANNOTATIONS.contains(&k.as_str()))
    {
        return None;
    }
    let null = serde_json::json!({"type": "null"});
    let other = match (&branches[0], &branches[1]) {
        (Value::Object(s), n) | (n, Value::Object(s)) if *n == null => s,
        _ => return None,
    };
    let Some(Value::String(ty)) = other.get("type") else {
        return None;
    };
    let fits = other.keys().all(|k| {
        k == "type"
            || k == "enum"
            || ANNOTATIONS.contains(&k.as_str())
            || only_for(ty).contains(&k.as_str())
    });
    if !fits || ty == "null" {
        return None;
    }
    let mut merged = other.clone();
    merged.insert("type".into(), serde_json::json!([ty, "null"]));
    if let Some(Value::Array(values)) = merged.get_mut("enum") {
        if !values.contains(&Value::Null) {
            values.push(Value::Null);
        }
    } else if merged.contains_key("enum") {
        return None;
    }
    Some(merged)
}

/// An input schema without `null` (the portable form of tools' arguments: an optional
/// argument is simply absent): `"type": [T, "null"]` becomes `T` (and `null` leaves its
/// `enum`); a `{"type": "null"}` branch leaves an `anyOf`, and one branch left takes the
/// union's place when none of its keywords but `anyOf` and annotations clashes with the
/// node's (the node's win).
pub(crate) fn without_nulls(v: &mut Value) {
    match v {
        Value::Object(map) => {
            single_type(map);
            drop_null_branch(map);
            map.values_mut().for_each(without_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(without_nulls),
        _ => {}
    }
}

/// `"type": [T, "null"]` → `"type": T`, and `null` out of the `enum`.
fn single_type(map: &mut Map<String, Value>) {
    let Some(Value::Array(types)) = map.get("type") else {
        return;
    };
    if types.len() != 2 || !types.iter().any(|t| t == "null") {
        return;
    }
    let Some(single) = types.iter().find(|t| *t != "null").cloned() else {
        return;
    };
    map.insert("type".into(), single);
    if let Some(Value::Array(values)) = map.get_mut("enum") {
        values.retain(|v| !v.is_null());
    }
}

/// `anyOf` without its `{"type": "null"}` branch; a single branch left is merged in.
fn drop_null_branch(map: &mut Map<String, Value>) {
    let Some(Value::Array(branches)) = map.get_mut("anyOf") else {
        return;
    };
    branches.retain(|b| *b != serde_json::json!({"type": "null"}));
    let [Value::Object(branch)] = branches.as_slice() else {
        return;
    };
    let branch = branch.clone();
    let clashes = branch
        .keys()
        .any(|k| map.contains_key(k) && !matches!(k.as_str(), "anyOf" | "description" | "title"));
    if clashes {
        return;
    }
    map.remove("anyOf");
    for (k, v) in branch {
        map.entry(k).or_insert(v);
    }
}

#[cfg(test)]
mod tests {
    use super::compact;
    use serde_json::json;

    fn compacted(mut v: serde_json::Value) -> serde_json::Value {
        compact(&mut v);
        v
    }

    #[test]
    fn documented_enums_become_enums_with_their_documentation() {
        let got = compacted(json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {"status": {"$ref": "#/$defs/Status", "description": "How it ended."}},
            "$defs": {"Status": {"description": "A status.", "oneOf": [
                {"const": "ok", "type": "string", "description": "Fine."},
                {"const": "error", "type": "string"}
            ]}}
        }));
        assert_eq!(
            got,
            json!({
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "properties": {"status": {
                    "type": "string",
                    "enum": ["ok", "error"],
                    "description": "How it ended.\n- `ok`: Fine."
                }}
            })
        );
    }

    #[test]
    fn references_inline_through_nullable_wrappers_and_nested_definitions() {
        let got = compacted(json!({
            "properties": {
                "policy": {"anyOf": [{"$ref": "#/$defs/Policy"}, {"type": "null"}]},
                "list": {"type": "array", "items": {"$ref": "#/$defs/Item"}}
            },
            "$defs": {
                "Policy": {"type": "object", "properties": {"item": {"$ref": "#/$defs/Item"}}},
                "Item": {"type": "integer", "minimum": 0}
            }
        }));
        assert_eq!(
            got,
            json!({
                "properties": {
                    "policy": {"type": ["object", "null"],
                               "properties": {"item": {"type": "integer", "minimum": 0}}},
                    "list": {"type": "array", "items": {"type": "integer", "minimum": 0}}
                }
            })
        );
    }

    #[test]
    fn what_cannot_be_inlined_keeps_its_reference_and_definition() {
        let got = compacted(json!({
            "properties": {
                "tree": {"$ref": "#/$defs/Tree"},
                "small": {"$ref": "#/$defs/Small", "maximum": 5},
                "outside": {"$ref": "other.json#/x"}
            },
            "$defs": {
                "Tree": {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/Tree"}}}},
                "Small": {"type": "integer", "maximum": 9}
            }
        }));
        // Recursion and a conflicting sibling stay references; an outside reference too.
        assert_eq!(
            got["properties"]["small"],
            json!({"$ref": "#/$defs/Small", "maximum": 5})
        );
        assert_eq!(
            got["properties"]["outside"],
            json!({"$ref": "other.json#/x"})
        );
        assert_eq!(
            got["properties"]["tree"]["properties"]["children"]["items"],
            json!({"$ref": "#/$defs/Tree"})
        );
        assert_eq!(
            got["$defs"],
            json!({
                "Tree": {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/Tree"}}}},
                "Small": {"type": "integer", "maximum": 9}
            })
        );
    }

    /// Every schema of every tool of every profile comes out with no reference and no
    /// documented enum left (a recursive type added later would show here).
    #[test]
    fn every_tool_schema_is_compact() {
        let tools = crate::tools::tools_for(&crate::doc_check::all_profiles());
        assert!(tools.len() > 5);
        for (_, tool) in tools {
            let text = serde_json::to_string(&(&tool.input_schema, &tool.output_schema))
                .expect("schemas as JSON");
            for left in ["$ref", "$defs", "\"const\""] {
                assert!(!text.contains(left), "{}: {left} in {text}", tool.name);
            }
            // An optional value is `[T, "null"]`: no `anyOf` of a single type and `null`.
            for schema in [
                &tool.input_schema,
                tool.output_schema.as_ref().unwrap_or(&tool.input_schema),
            ] {
                let v = serde_json::Value::Object(schema.as_ref().clone());
                assert!(!any_nullable_any_of(&v), "{}: {v}", tool.name);
            }
            // Input schemas have single types: an optional argument is simply absent.
            let input = serde_json::to_string(&tool.input_schema).expect("schema as JSON");
            assert!(
                !input.contains("\"null\""),
                "{}: a nullable input: {input}",
                tool.name
            );
        }
    }

    #[test]
    fn input_schemas_lose_null() {
        let mut v = json!({"type": "object", "properties": {
            "a": {"type": ["string", "null"], "enum": ["x", null]},
            "b": {"description": "B.", "anyOf": [
                {"description": "B's forms.", "anyOf": [{"type": "boolean"}, {"type": "array"}]},
                {"type": "null"}
            ]},
            "c": {"anyOf": [{"type": "integer"}, {"type": "string"}, {"type": "null"}]},
            "d": {"default": 1, "anyOf": [{"type": "integer", "default": 2}, {"type": "null"}]}
        }});
        super::without_nulls(&mut v);
        assert_eq!(
            v["properties"],
            json!({
                "a": {"type": "string", "enum": ["x"]},
                "b": {"description": "B.", "anyOf": [{"type": "boolean"}, {"type": "array"}]},
                "c": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
                "d": {"default": 1, "anyOf": [{"type": "integer", "default": 2}]}
            })
        );
    }

    #[test]
    fn an_optional_value_of_one_type_takes_null_into_its_type() {
        let got = compacted(json!({
            "properties": {
                "policy": {"description": "Why.", "anyOf": [
                    {"type": "object", "description": "A policy.", "required": ["a"],
                     "properties": {"a": {"type": "integer"}}},
                    {"type": "null"}
                ]},
                "kind": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/Kind"}]}
            },
            "$defs": {"Kind": {"oneOf": [{"const": "a", "type": "string", "description": "A."}]}}
        }));
        assert_eq!(
            got,
            json!({"properties": {
                "policy": {"description": "Why.\nA policy.", "type": ["object", "null"],
                           "required": ["a"], "properties": {"a": {"type": "integer"}}},
                "kind": {"type": ["string", "null"], "enum": ["a", null], "description": "- `a`: A."}
            }})
        );
    }

    /// Where `null` would get through a keyword that applies to every type, or the node says
    /// more than the `anyOf`, it stays an `anyOf`.
    #[test]
    fn an_optional_value_that_cannot_merge_is_left_alone() {
        for any_of in [
            json!({"anyOf": [{"type": "object", "not": {"required": ["a"]}}, {"type": "null"}]}),
            json!({"anyOf": [{"type": "string", "const": "a"}, {"type": "null"}]}),
            json!({"anyOf": [{"type": ["string", "integer"]}, {"type": "null"}]}),
            json!({"anyOf": [{"minimum": 1}, {"type": "null"}]}),
            json!({"anyOf": [{"type": "integer", "minLength": 1}, {"type": "null"}]}),
            json!({"anyOf": [{"type": "integer"}, {"type": "null"}], "minimum": 1}),
            json!({"anyOf": [{"type": "integer"}, {"type": "string"}]}),
            json!({"anyOf": [{"type": "integer"}, {"type": "null"}, {"type": "string"}]}),
            json!({"anyOf": [{"type": "integer"}, {"type": "null", "description": "x"}]}),
        ] {
            assert_eq!(compacted(any_of.clone()), any_of);
        }
    }

    fn any_nullable_any_of(v: &serde_json::Value) -> bool {
        match v {
            serde_json::Value::Object(map) => {
                let nullable = map
                    .get("anyOf")
                    .and_then(|a| a.as_array())
                    .is_some_and(|a| {
                        a.len() == 2
                            && a.contains(&json!({"type": "null"}))
                            && a.iter().any(|b| {
                                *b != json!({"type": "null"})
                                    && b.get("type").is_some_and(|t| t.is_string())
                            })
                    });
                nullable || map.values().any(any_nullable_any_of)
            }
            serde_json::Value::Array(items) => items.iter().any(any_nullable_any_of),
            _ => false,
        }
    }

    #[test]
    fn a_oneof_that_is_not_plain_string_constants_is_left_alone() {
        for one_of in [
            json!([{"const": 1}, {"const": 2}]),
            json!([{"const": "a", "type": "string"}, {"type": "integer"}]),
            json!([{"const": "a", "minLength": 2}]),
            json!([{"const": "a"}, {"const": "a"}]),
        ] {
            let v = json!({"oneOf": one_of});
            assert_eq!(compacted(v.clone()), v);
        }
    }
}
