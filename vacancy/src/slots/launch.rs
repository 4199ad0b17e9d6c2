//! Launch-argv composition: a llama-server command from four layers,
//! deduplicated last-wins, with the layer that set each surviving flag.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// A layer of a slot's launch command, lowest precedence first.
///
/// base < model < profile < slot (SLOTCFG-22); wire names lowercase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LaunchLayer {
    /// `--host`, `--port`, `--model`, `--alias`, `--ctx-size` (SLOTCFG-23).
    Base,
    /// Family quirks, `--jinja`, `--chat-template-file`, `--mmproj`,
    /// `--spec-type`/`--spec-draft-model` (SLOTCFG-24).
    Model,
    /// The draft bundle, then the profile's flags (SLOTCFG-25).
    Profile,
    /// `--device`, `-ngl`, `--threads`, `--metrics`, `--spec-draft-device`
    /// (SLOTCFG-26).
    Slot,
}

impl LaunchLayer {
    /// The lowercase wire name.
    ///
    /// `base`, `model`, `profile` or `slot` (SLOTCFG-28 provenance values).
    pub const fn as_str(self) -> &'static str {
        match self {
            LaunchLayer::Base => "base",
            LaunchLayer::Model => "model",
            LaunchLayer::Profile => "profile",
            LaunchLayer::Slot => "slot",
        }
    }
}

impl fmt::Display for LaunchLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One flag with its values, e.g. `--ctx-size 8192` or `--jinja`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchFlag {
    /// The flag as written, e.g. `--ctx-size` or `-c`.
    pub flag: String,
    /// Its values, possibly none.
    pub values: Vec<String>,
}

impl LaunchFlag {
    /// A flag with the given values.
    pub fn new(flag: impl Into<String>, values: &[&str]) -> Self {
        LaunchFlag {
            flag: flag.into(),
            values: values.iter().map(|v| (*v).to_owned()).collect(),
        }
    }
}

/// Short and long spellings of one llama-server option, canonical (long)
/// spelling first. Deduplication treats them as one flag.
const ALIASES: &[&[&str]] = &[
    &["--model", "-m"],
    &["--alias", "-a"],
    &["--ctx-size", "-c"],
    &["--n-gpu-layers", "-ngl", "--gpu-layers"],
    &["--threads", "-t"],
    &["--device", "-dev"],
    &["--parallel", "-np"],
    &["--flash-attn", "-fa"],
    &["--batch-size", "-b"],
    &["--ubatch-size", "-ub"],
    &["--mmproj", "-mm"],
    &["--cache-type-k", "-ctk"],
    &["--cache-type-v", "-ctv"],
];

/// The spelling deduplication compares: the canonical long form of a known
/// alias, the flag itself otherwise.
///
/// SLOTCFG-22: `-c` and `--ctx-size` are the same flag, so a later `-c`
/// replaces an earlier `--ctx-size`.
pub fn canonical_flag(flag: &str) -> &str {
    ALIASES
        .iter()
        .find(|names| names.contains(&flag))
        .map_or(flag, |names| names[0])
}

/// Whether a token starts a flag (a dash followed by a non-digit) rather than
/// being a value such as `-1`.
fn is_flag(token: &str) -> bool {
    let mut chars = token.chars();
    chars.next() == Some('-')
        && chars
            .next()
            .is_some_and(|c| !c.is_ascii_digit() && c != '.')
}

/// Splits argv tokens into flags with their values.
///
/// # Behavior
///
/// A token starting with `-` followed by a non-digit starts a flag; the tokens
/// after it until the next flag are its values (so `-1` and `""` are values).
/// `--flag=value` is split at the first `=`. Tokens before the first flag are
/// dropped (the executable is not a flag).
pub fn parse_launch_args<S: AsRef<str>>(tokens: &[S]) -> Vec<LaunchFlag> {
    let mut flags: Vec<LaunchFlag> = Vec::new();
    for token in tokens {
        let token = token.as_ref();
        if is_flag(token) {
            match token.split_once('=') {
                Some((flag, value)) if flag.starts_with("--") => flags.push(LaunchFlag {
                    flag: flag.to_owned(),
                    values: vec![value.to_owned()],
                }),
                _ => flags.push(LaunchFlag {
                    flag: token.to_owned(),
                    values: Vec::new(),
                }),
            }
        } else if let Some(last) = flags.last_mut() {
            last.values.push(token.to_owned());
        }
    }
    flags
}

/// The layer that set one surviving flag.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlagProvenance {
    /// The flag as it appears in the argv.
    pub flag: String,
    /// The layer that set it.
    pub layer: LaunchLayer,
}

/// A slot's resolved launch command, as `GET /api/slots/{name}/resolved`
/// returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResolvedLaunch {
    /// The deduplicated argv; `None` for a slot with no llama-server command
    /// or one that cannot launch.
    pub argv: Option<Vec<String>>,
    /// For each surviving flag in argv order, the layer that set it.
    pub provenance: Vec<FlagProvenance>,
}

impl ResolvedLaunch {
    /// The answer for a slot with no llama-server command, or one that cannot
    /// launch.
    ///
    /// `argv: null` with an empty provenance (SLOTCFG-29).
    pub fn not_launchable() -> Self {
        ResolvedLaunch {
            argv: None,
            provenance: Vec::new(),
        }
    }

    /// The response body: `{"argv": [...] | null, "provenance": {flag: layer}}`.
    ///
    /// SLOTCFG-28, SLOTCFG-29.
    pub fn to_json(&self) -> Value {
        let provenance: Map<String, Value> = self
            .provenance
            .iter()
            .map(|p| (p.flag.clone(), Value::from(p.layer.as_str())))
            .collect();
        json!({ "argv": self.argv, "provenance": provenance })
    }
}

/// Composes a llama-server command from its layers.
///
/// # Behavior
///
/// Layers apply in precedence order base < model < profile < slot whatever
/// order they are passed in (stable within a layer) (SLOTCFG-22). A flag set
/// again later — in the same or a higher layer, under any alias
/// ([`canonical_flag`]) — replaces the earlier one: last wins, and the
/// survivor sits where the last setter put it. `program`, when given, is
/// argv\[0\]. Provenance names, for every surviving flag in argv order, the
/// layer that set it (SLOTCFG-28). Every flag is treated as single-valued, as
/// the seed says "deduplicated last-wins" without exceptions.
pub fn compose_launch_argv(
    program: Option<&str>,
    layers: &[(LaunchLayer, Vec<LaunchFlag>)],
) -> ResolvedLaunch {
    let mut ordered: Vec<&(LaunchLayer, Vec<LaunchFlag>)> = layers.iter().collect();
    ordered.sort_by_key(|(layer, _)| *layer);
    let mut survivors: Vec<(LaunchLayer, &LaunchFlag)> = Vec::new();
    for (layer, flags) in ordered {
        for flag in flags {
            let key = canonical_flag(&flag.flag);
            survivors.retain(|(_, f)| canonical_flag(&f.flag) != key);
            survivors.push((*layer, flag));
        }
    }
    let mut argv: Vec<String> = program.map(str::to_owned).into_iter().collect();
    let mut provenance = Vec::with_capacity(survivors.len());
    for (layer, flag) in survivors {
        argv.push(flag.flag.clone());
        argv.extend(flag.values.iter().cloned());
        provenance.push(FlagProvenance {
            flag: flag.flag.clone(),
            layer,
        });
    }
    ResolvedLaunch {
        argv: Some(argv),
        provenance,
    }
}

/// The `--device` value for a slot's device.
///
/// # Behavior
///
/// `ROCm0`, `Vulkan0`, `CUDA0` or `none` (SLOTCFG-26). The seed lists the
/// values but not the slot-device spellings; this crate reads `rocm`,
/// `vulkan`, `cuda` and `cpu` (→ `none`) and returns `None` for any other
/// device (e.g. `npu`, which has no llama-server lane).
pub fn llama_device_arg(slot_device: &str) -> Option<&'static str> {
    match slot_device {
        "rocm" => Some("ROCm0"),
        "vulkan" => Some("Vulkan0"),
        "cuda" => Some("CUDA0"),
        "cpu" => Some("none"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn layer(l: LaunchLayer, tokens: &[&str]) -> (LaunchLayer, Vec<LaunchFlag>) {
        (l, parse_launch_args(tokens))
    }

    // SLOTCFG-22 to SLOTCFG-28
    #[test]
    fn slotcfg_22_layers_dedup_last_wins_with_provenance() {
        let layers = vec![
            layer(
                LaunchLayer::Base,
                &[
                    "--host",
                    "127.0.0.1",
                    "--port",
                    "8081",
                    "--model",
                    "/m.gguf",
                    "--alias",
                    "qwen",
                    "--ctx-size",
                    "4096",
                ],
            ),
            layer(
                LaunchLayer::Model,
                &["--jinja", "--chat-template-file", "/t.jinja"],
            ),
            layer(
                LaunchLayer::Profile,
                &["-c", "32768", "--flash-attn", "on", "-ngl", "10"],
            ),
            layer(
                LaunchLayer::Slot,
                &[
                    "--device",
                    "ROCm0",
                    "-ngl",
                    "99",
                    "--threads",
                    "8",
                    "--metrics",
                ],
            ),
        ];
        let r = compose_launch_argv(Some("llama-server"), &layers);
        assert_eq!(
            r.argv.clone().unwrap(),
            vec![
                "llama-server",
                "--host",
                "127.0.0.1",
                "--port",
                "8081",
                "--model",
                "/m.gguf",
                "--alias",
                "qwen",
                "--jinja",
                "--chat-template-file",
                "/t.jinja",
                "-c",
                "32768",
                "--flash-attn",
                "on",
                "--device",
                "ROCm0",
                "-ngl",
                "99",
                "--threads",
                "8",
                "--metrics",
            ]
        );
        let prov: Vec<(&str, &str)> = r
            .provenance
            .iter()
            .map(|p| (p.flag.as_str(), p.layer.as_str()))
            .collect();
        assert_eq!(
            prov,
            vec![
                ("--host", "base"),
                ("--port", "base"),
                ("--model", "base"),
                ("--alias", "base"),
                ("--jinja", "model"),
                ("--chat-template-file", "model"),
                ("-c", "profile"),
                ("--flash-attn", "profile"),
                ("--device", "slot"),
                ("-ngl", "slot"),
                ("--threads", "slot"),
                ("--metrics", "slot"),
            ]
        );
        let body = r.to_json();
        assert_eq!(body["provenance"]["-c"], "profile");
        assert_eq!(body["provenance"]["-ngl"], "slot");
        assert!(body["provenance"].get("--ctx-size").is_none());
    }

    // SLOTCFG-22: precedence holds whatever order the layers are passed in.
    #[test]
    fn slotcfg_22_precedence_is_by_layer_not_by_position() {
        let layers = vec![
            layer(LaunchLayer::Slot, &["--threads", "8"]),
            layer(LaunchLayer::Profile, &["--threads", "4"]),
            layer(LaunchLayer::Base, &["--threads", "2", "--port", "1"]),
        ];
        let r = compose_launch_argv(None, &layers);
        assert_eq!(r.argv.unwrap(), vec!["--port", "1", "--threads", "8"]);
        assert_eq!(r.provenance[1].layer, LaunchLayer::Slot);
    }

    // SLOTCFG-22: duplicates within one layer also resolve last-wins.
    #[test]
    fn slotcfg_22_dedup_within_a_layer() {
        let r = compose_launch_argv(
            None,
            &[layer(
                LaunchLayer::Profile,
                &["-fa", "off", "--flash-attn", "on"],
            )],
        );
        assert_eq!(r.argv.unwrap(), vec!["--flash-attn", "on"]);
        assert_eq!(r.provenance.len(), 1);
    }

    // SLOTCFG-29
    #[test]
    fn slotcfg_29_not_launchable() {
        let r = ResolvedLaunch::not_launchable();
        assert_eq!(r.to_json(), json!({"argv": null, "provenance": {}}));
    }

    #[test]
    fn parse_handles_values_negatives_and_equals() {
        let f = parse_launch_args(&[
            "llama-server",
            "--seed",
            "-1",
            "--model",
            "",
            "--x=y=z",
            "-c",
            "8",
        ]);
        assert_eq!(
            f,
            vec![
                LaunchFlag::new("--seed", &["-1"]),
                LaunchFlag::new("--model", &[""]),
                LaunchFlag::new("--x", &["y=z"]),
                LaunchFlag::new("-c", &["8"]),
            ]
        );
        assert_eq!(canonical_flag("-ngl"), "--n-gpu-layers");
        assert_eq!(canonical_flag("--gpu-layers"), "--n-gpu-layers");
        assert_eq!(canonical_flag("--weird"), "--weird");
    }

    // SLOTCFG-26
    #[test]
    fn slotcfg_26_device_values() {
        assert_eq!(llama_device_arg("rocm"), Some("ROCm0"));
        assert_eq!(llama_device_arg("vulkan"), Some("Vulkan0"));
        assert_eq!(llama_device_arg("cuda"), Some("CUDA0"));
        assert_eq!(llama_device_arg("cpu"), Some("none"));
        assert_eq!(llama_device_arg("npu"), None);
    }

    /// The provenance of `argv`'s surviving flags, as (flag, layer) pairs.
    fn provenance(r: &ResolvedLaunch) -> Vec<(String, &'static str)> {
        r.provenance
            .iter()
            .map(|p| (p.flag.clone(), p.layer.as_str()))
            .collect()
    }

    // SLOTCFG-23: vacancy composes the layers its caller builds; the base
    // layer's five flags survive as "base" unless a higher layer sets them.
    #[test]
    fn slotcfg_23_the_base_layer_sets_host_port_model_alias_and_ctx_size() {
        let base = layer(
            LaunchLayer::Base,
            &[
                "--host",
                "127.0.0.1",
                "--port",
                "8081",
                "--model",
                "/m.gguf",
                "--alias",
                "qwen",
                "--ctx-size",
                "4096",
            ],
        );
        let r = compose_launch_argv(None, std::slice::from_ref(&base));
        let flags: Vec<(String, &str)> = ["--host", "--port", "--model", "--alias", "--ctx-size"]
            .iter()
            .map(|f| ((*f).to_owned(), "base"))
            .collect();
        assert_eq!(provenance(&r), flags);
        // A profile's context (under its short spelling) replaces the base one.
        let r = compose_launch_argv(None, &[base, layer(LaunchLayer::Profile, &["-c", "32768"])]);
        let prov = provenance(&r);
        assert!(prov.contains(&("-c".to_owned(), "profile")), "{prov:?}");
        assert!(!prov.iter().any(|(f, _)| f == "--ctx-size"), "{prov:?}");
        assert_eq!(prov.iter().filter(|(_, l)| *l == "base").count(), 4);
    }

    // SLOTCFG-24: the model layer's quirks, template, vision projector and
    // speculative-decoding flags all reach the command as "model".
    #[test]
    fn slotcfg_24_the_model_layer_sets_quirks_templates_mmproj_and_speculation() {
        let r = compose_launch_argv(
            Some("llama-server"),
            &[
                layer(LaunchLayer::Base, &["--model", "/m.gguf"]),
                layer(
                    LaunchLayer::Model,
                    &[
                        "--jinja",
                        "--chat-template-file",
                        "/t.jinja",
                        "--mmproj",
                        "/mmproj.gguf",
                        "--spec-type",
                        "draft",
                        "--spec-draft-model",
                        "/draft.gguf",
                    ],
                ),
            ],
        );
        let prov = provenance(&r);
        for flag in [
            "--jinja",
            "--chat-template-file",
            "--mmproj",
            "--spec-type",
            "--spec-draft-model",
        ] {
            assert!(
                prov.contains(&(flag.to_owned(), "model")),
                "{flag}: {prov:?}"
            );
        }
        let argv = r.argv.unwrap();
        let at = argv.iter().position(|a| a == "--spec-draft-model").unwrap();
        assert_eq!(argv[at + 1], "/draft.gguf");
        // `-mm` is `--mmproj`: a later layer's projector replaces the model's.
        let r = compose_launch_argv(
            None,
            &[
                layer(LaunchLayer::Model, &["--mmproj", "/a.gguf"]),
                layer(LaunchLayer::Slot, &["-mm", "/b.gguf"]),
            ],
        );
        assert_eq!(provenance(&r), [("-mm".to_owned(), "slot")]);
    }

    // SLOTCFG-25: the profile layer is its kind's draft bundle, then the
    // profile's own flags; the profile's own setting of a bundle flag wins
    // and sits where the profile put it.
    #[test]
    fn slotcfg_25_the_profile_layer_is_the_draft_bundle_then_the_profiles_flags() {
        let bundle = ["--spec-draft-n-max", "16", "--spec-draft-n-min", "4"];
        let own = ["--flash-attn", "on", "--spec-draft-n-max", "8"];
        let tokens: Vec<&str> = bundle.iter().chain(own.iter()).copied().collect();
        let r = compose_launch_argv(None, &[layer(LaunchLayer::Profile, &tokens)]);
        assert_eq!(
            r.argv.clone().unwrap(),
            [
                "--spec-draft-n-min",
                "4",
                "--flash-attn",
                "on",
                "--spec-draft-n-max",
                "8"
            ]
        );
        assert!(provenance(&r).iter().all(|(_, l)| *l == "profile"));
    }

    // SLOTCFG-27: a paired drafter runs on the model's devices: the slot
    // layer sets the model's --device and, for a drafter file (not embedded
    // MTP heads), no draft device of its own, so llama-server places the
    // drafter with the model. (The placement itself is llama-server's.)
    #[test]
    fn slotcfg_27_a_paired_drafter_gets_no_device_of_its_own() {
        let r = compose_launch_argv(
            None,
            &[
                layer(LaunchLayer::Model, &["--spec-draft-model", "/draft.gguf"]),
                layer(
                    LaunchLayer::Slot,
                    &["--device", llama_device_arg("rocm").unwrap(), "-ngl", "99"],
                ),
            ],
        );
        let argv = r.argv.unwrap();
        assert_eq!(argv.iter().filter(|a| a.as_str() == "--device").count(), 1);
        assert!(
            !argv
                .iter()
                .any(|a| a.contains("draft-device") || a == "-devd"),
            "{argv:?}"
        );
        let at = argv.iter().position(|a| a == "--device").unwrap();
        assert_eq!(argv[at + 1], "ROCm0");
    }
}
