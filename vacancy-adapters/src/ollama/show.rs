//! `POST /api/show`: a model's Modelfile `num_ctx` (RES-09).

use serde_json::Value;

use super::contexts::Modelfile;

/// The Modelfile `num_ctx` in an `/api/show` answer.
///
/// # Behavior
///
/// Ollama lists the Modelfile's parameters in `parameters`, one per line,
/// name then value (`num_ctx                        8192`). An answer
/// without `parameters` (or with none naming `num_ctx`) sets no `num_ctx`;
/// an answer that is not a JSON object, a `parameters` that is not a string,
/// or a `num_ctx` that is not a whole number is an error (no credit, OBS-03).
pub fn modelfile_num_ctx(v: &Value) -> Result<Modelfile, String> {
    let obj = v
        .as_object()
        .ok_or_else(|| "the /api/show answer is not a JSON object".to_owned())?;
    let params = match obj.get("parameters") {
        None | Some(Value::Null) => return Ok(Modelfile::Unset),
        Some(Value::String(p)) => p,
        Some(_) => return Err("\"parameters\" in the /api/show answer is not a string".to_owned()),
    };
    let mut found = Modelfile::Unset;
    for line in params.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("num_ctx") {
            continue;
        }
        let value = words.next().unwrap_or("");
        let n: u64 = value
            .trim_matches('"')
            .parse()
            .map_err(|_| format!("the Modelfile's num_ctx {value:?} is not a whole number"))?;
        // A later PARAMETER line wins, as in a Modelfile.
        found = Modelfile::NumCtx(n);
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn the_modelfile_num_ctx_is_read_from_parameters() {
        // RES-09
        let show = json!({
            "modelfile": "FROM x\nPARAMETER num_ctx 8192",
            "parameters": "stop                           \"<|eot_id|>\"\nnum_ctx                        8192\ntemperature                    0.7",
            "template": "{{ .Prompt }}",
        });
        assert_eq!(modelfile_num_ctx(&show), Ok(Modelfile::NumCtx(8192)));
        assert_eq!(
            modelfile_num_ctx(&json!({"parameters": "temperature 0.7"})),
            Ok(Modelfile::Unset)
        );
        assert_eq!(
            modelfile_num_ctx(&json!({"license": "x"})),
            Ok(Modelfile::Unset)
        );
        assert_eq!(
            modelfile_num_ctx(&json!({"parameters": "num_ctx 2048\nnum_ctx 4096"})),
            Ok(Modelfile::NumCtx(4096))
        );
    }

    #[test]
    fn a_malformed_show_gives_no_num_ctx() {
        // OBS-03: unusable answers give no credit.
        for bad in [
            json!([]),
            json!("x"),
            json!({"parameters": 5}),
            json!({"parameters": "num_ctx lots"}),
            json!({"parameters": "num_ctx"}),
            json!({"parameters": "num_ctx -1"}),
        ] {
            assert!(modelfile_num_ctx(&bad).is_err(), "{bad}");
        }
    }
}
