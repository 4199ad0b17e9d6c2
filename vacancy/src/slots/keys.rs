//! Walking the keys of a slot payload (a slot file or a slot write body as JSON).

use serde_json::Value;

/// Every key path in `payload` (dotted, e.g. `model.ctx_size`), depth first, with the key's last segment; arrays add their index as a
/// segment. The `server.env` table is not entered: its keys are environment
/// variable names, checked on their own (SLOTCFG-05).
pub(crate) fn key_paths(payload: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    walk(payload, "", &mut out);
    out
}

fn walk(value: &Value, prefix: &str, out: &mut Vec<(String, String)>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                let path = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}.{key}")
                };
                out.push((path.clone(), key.clone()));
                if path != "server.env" {
                    walk(child, &path, out);
                }
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                walk(child, &format!("{prefix}.{i}"), out);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_dotted_and_skip_server_env() {
        let v = serde_json::json!({
            "a": 1,
            "model": {"default": "m", "ctx_size": 4},
            "server": {"env": {"parallel": "1"}, "x": [{"y": 1}]}
        });
        let mut paths: Vec<String> = key_paths(&v).into_iter().map(|p| p.0).collect();
        paths.sort();
        assert_eq!(
            paths,
            vec![
                "a",
                "model",
                "model.ctx_size",
                "model.default",
                "server",
                "server.env",
                "server.x",
                "server.x.0.y"
            ]
        );
    }
}
