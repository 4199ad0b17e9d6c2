//! Self-managed providers: runners that serve a baked-in model.

/// Providers that serve a baked-in model, so dispatching to them needs no
/// explicit `model_id` (PROV-01).
pub const SELF_MANAGED_PROVIDERS: [&str; 4] = ["kokoro", "qwen3tts", "moonshine", "vibevoice"];

/// Whether dispatching to `provider` needs an explicit `model_id`.
///
/// False for [`SELF_MANAGED_PROVIDERS`] (PROV-01), true for every other
/// provider (PROV-01 Ambiguity reading). Names match exactly (lowercase).
pub fn provider_requires_model(provider: &str) -> bool {
    !SELF_MANAGED_PROVIDERS.contains(&provider)
}

#[cfg(test)]
mod tests {
    use super::*;

    // PROV-01
    #[test]
    fn prov_01_self_managed_providers_need_no_model() {
        for p in ["kokoro", "qwen3tts", "moonshine", "vibevoice"] {
            assert!(!provider_requires_model(p), "{p}");
        }
        for p in ["llama", "whisper", "Kokoro", ""] {
            assert!(provider_requires_model(p), "{p}");
        }
        assert_eq!(SELF_MANAGED_PROVIDERS.len(), 4);
    }
}
