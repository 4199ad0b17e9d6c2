//! Learned Ollama contexts (RES-05..14): which request kinds are known to
//! reuse the context a model is loaded with. Pure state: no I/O, no clock.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use vacancy::engine::ResidencyEvidence;

use super::names::{Family, RequestKind};

/// Learned kinds kept per model (RES-12): the oldest is forgotten first.
pub const MAX_KINDS_PER_MODEL: usize = 8;

/// Models kept per upstream: the one learned longest ago is forgotten first,
/// so the cache cannot grow without bound.
pub const MAX_MODELS: usize = 128;

/// What a model's Modelfile says about `num_ctx` (RES-09).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Modelfile {
    /// `PARAMETER num_ctx N`.
    NumCtx(u64),
    /// The Modelfile sets no `num_ctx`.
    Unset,
    /// `/api/show` has not answered usably for this digest.
    Unknown,
}

impl Modelfile {
    fn num_ctx(self) -> Option<u64> {
        match self {
            Modelfile::NumCtx(n) => Some(n),
            _ => None,
        }
    }
}

/// One learned kind of one model: the context requests of that kind left it
/// loaded with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LearnedKind {
    /// The kind's explicit `num_ctx` (`null`: unset).
    pub num_ctx: Option<u64>,
    /// The kind's route family.
    pub family: Family,
    /// The context `/api/ps` showed after such a request (RES-07).
    pub context: u64,
}

/// Everything learned about one model, valid for one digest (RES-13/14).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelContexts {
    /// The digest the contexts were learned with.
    pub digest: String,
    /// Whether a learned context showed parallel slots (RES-08, RES-10).
    #[serde(default)]
    pub parallel: bool,
    /// A counter value of the last lesson, for forgetting the oldest model.
    #[serde(default)]
    pub learned: u64,
    /// Learned kinds, oldest first, at most [`MAX_KINDS_PER_MODEL`].
    pub kinds: Vec<LearnedKind>,
}

/// The learned contexts of one upstream, by canonical model.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LearnedContexts {
    /// Per canonical model.
    pub models: BTreeMap<String, ModelContexts>,
}

/// What one lesson changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Learned {
    /// The context learned for the kind.
    pub context: u64,
    /// This lesson showed parallel slots (a multiple of the requested context).
    pub parallel: bool,
    /// Contexts learned under an older digest were forgotten first (RES-14).
    pub forgot_old_digest: bool,
}

impl LearnedContexts {
    /// Forget `model`'s contexts when `/api/ps` reports a digest other than
    /// the one they were learned with (RES-14). `true` when something was forgotten.
    pub fn note_digest(&mut self, model: &str, digest: &str) -> bool {
        if self.models.get(model).is_some_and(|m| m.digest != digest) {
            self.models.remove(model);
            return true;
        }
        false
    }

    /// Learn that requests of `kind` leave the model loaded with `loaded`
    /// tokens of context, with weights `digest` (RES-07, RES-08).
    ///
    /// Parallel slots show when the loaded context is a multiple (2× or more)
    /// of the requested one: the explicit `num_ctx`, else the Modelfile's
    /// (RES-08). With neither known the lesson still counts; it just cannot
    /// tell parallel slots.
    pub fn learn(
        &mut self,
        kind: &RequestKind,
        digest: &str,
        loaded: u64,
        modelfile: Modelfile,
    ) -> Learned {
        let forgot_old_digest = self.note_digest(&kind.model, digest);
        let requested = kind.num_ctx.or(modelfile.num_ctx());
        let parallel = requested.is_some_and(|r| r > 0 && loaded > r && loaded.is_multiple_of(r));
        let stamp = self.models.values().map(|m| m.learned).max().unwrap_or(0) + 1;
        if !self.models.contains_key(&kind.model) && self.models.len() >= MAX_MODELS {
            let oldest = self
                .models
                .iter()
                .min_by_key(|(_, m)| m.learned)
                .map(|(name, _)| name.clone());
            if let Some(name) = oldest {
                self.models.remove(&name);
            }
        }
        let entry = self
            .models
            .entry(kind.model.clone())
            .or_insert_with(|| ModelContexts {
                digest: digest.to_owned(),
                parallel: false,
                learned: stamp,
                kinds: Vec::new(),
            });
        entry.learned = stamp;
        entry.parallel |= parallel;
        entry
            .kinds
            .retain(|k| !(k.num_ctx == kind.num_ctx && k.family == kind.family));
        entry.kinds.push(LearnedKind {
            num_ctx: kind.num_ctx,
            family: kind.family,
            context: loaded,
        });
        if entry.kinds.len() > MAX_KINDS_PER_MODEL {
            let excess = entry.kinds.len() - MAX_KINDS_PER_MODEL;
            entry.kinds.drain(..excess);
        }
        Learned {
            context: loaded,
            parallel,
            forgot_old_digest,
        }
    }

    /// Which request kinds are known to reuse `model` loaded with `loaded`
    /// tokens of context and weights `digest` (RES-05, RES-10, RES-11).
    ///
    /// # Behavior
    ///
    /// - A kind with a learned context is credited exactly when that context
    ///   is the loaded one (RES-05 a); a learned context that differs means
    ///   the model was reloaded differently, and the kind is charged in full
    ///   whatever (b) or (c) say (RES-11).
    /// - A kind with nothing learned is credited when its explicit `num_ctx`
    ///   equals the loaded context (b), or when it leaves `num_ctx` unset and
    ///   the Modelfile sets the loaded context (c) — unless parallel slots
    ///   were seen for this model, after which only learned contexts count
    ///   (RES-10). `/v1` requests never set `num_ctx`, so (b) is `/api` only.
    /// - Contexts learned under another digest count for nothing (RES-14).
    pub fn evidence(
        &self,
        model: &str,
        digest: &str,
        loaded: u64,
        modelfile: Modelfile,
    ) -> ResidencyEvidence {
        let entry = self.models.get(model).filter(|m| m.digest == digest);
        let learned = entry.map_or(&[][..], |m| m.kinds.as_slice());
        let parallel = entry.is_some_and(|m| m.parallel);
        let learned_for = |num_ctx: Option<u64>, family: Family| {
            learned
                .iter()
                .find(|k| k.num_ctx == num_ctx && k.family == family)
        };
        let kind = |num_ctx: Option<u64>, family: Family| {
            RequestKind {
                model: model.to_owned(),
                num_ctx,
                family,
            }
            .to_string()
        };
        let mut kinds: Vec<String> = learned
            .iter()
            .filter(|k| k.context == loaded)
            .map(|k| kind(k.num_ctx, k.family))
            .collect();
        if !parallel {
            let mut unlearned = vec![(Some(loaded), Family::Api)];
            if modelfile.num_ctx() == Some(loaded) {
                unlearned.push((None, Family::Api));
                unlearned.push((None, Family::V1));
            }
            for (num_ctx, family) in unlearned {
                if learned_for(num_ctx, family).is_none() {
                    kinds.push(kind(num_ctx, family));
                }
            }
        }
        let mut facts = Vec::new();
        if learned.is_empty() {
            facts.push("nothing learned for it".to_owned());
        } else {
            let list: Vec<String> = learned
                .iter()
                .map(|k| match k.num_ctx {
                    Some(n) => format!("num_ctx {n} {} → {}", k.family.as_str(), k.context),
                    None => format!("num_ctx unset {} → {}", k.family.as_str(), k.context),
                })
                .collect();
            facts.push(format!("learned: {}", list.join(", ")));
        }
        facts.push(match modelfile {
            Modelfile::NumCtx(n) => format!("Modelfile num_ctx {n}"),
            Modelfile::Unset => "the Modelfile sets no num_ctx".to_owned(),
            Modelfile::Unknown => "Modelfile num_ctx unknown".to_owned(),
        });
        if parallel {
            facts.push("parallel slots seen, so only learned contexts count".to_owned());
        }
        ResidencyEvidence::ProvenFor {
            kinds,
            otherwise: format!(
                "{model} is loaded with context {loaded}, which requests of this kind are not known to reuse ({})",
                facts.join("; ")
            ),
        }
    }

    /// Drop what a file may hold that this version never writes: kinds
    /// beyond the bound, zero contexts, empty digests.
    pub fn sanitize(&mut self) {
        self.models.retain(|_, m| !m.digest.is_empty());
        for m in self.models.values_mut() {
            m.kinds.retain(|k| k.context > 0);
            if m.kinds.len() > MAX_KINDS_PER_MODEL {
                let excess = m.kinds.len() - MAX_KINDS_PER_MODEL;
                m.kinds.drain(..excess);
            }
        }
        while self.models.len() > MAX_MODELS {
            let oldest = self
                .models
                .iter()
                .min_by_key(|(_, m)| m.learned)
                .map(|(name, _)| name.clone());
            match oldest {
                Some(name) => {
                    self.models.remove(&name);
                }
                None => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const M: &str = "llama3:latest";
    const D: &str = "sha256:aaa";

    fn kind(num_ctx: Option<u64>, family: Family) -> RequestKind {
        RequestKind {
            model: M.to_owned(),
            num_ctx,
            family,
        }
    }

    fn credited(c: &LearnedContexts, loaded: u64, mf: Modelfile) -> Vec<String> {
        match c.evidence(M, D, loaded, mf) {
            ResidencyEvidence::ProvenFor { mut kinds, .. } => {
                kinds.sort();
                kinds
            }
            other => panic!("{other:?}"),
        }
    }

    fn s(k: RequestKind) -> String {
        k.to_string()
    }

    #[test]
    fn explicit_num_ctx_equal_to_the_loaded_context_is_credited() {
        // RES-05 (b): nothing learned, explicit num_ctx equals the loaded context.
        let c = LearnedContexts::default();
        assert_eq!(
            credited(&c, 8192, Modelfile::Unset),
            [s(kind(Some(8192), Family::Api))]
        );
    }

    #[test]
    fn the_modelfile_num_ctx_credits_requests_that_leave_it_unset() {
        // RES-05 (c), RES-09: a preloaded model is credited on its first request.
        let c = LearnedContexts::default();
        let mut want = vec![
            s(kind(Some(2048), Family::Api)),
            s(kind(None, Family::Api)),
            s(kind(None, Family::V1)),
        ];
        want.sort();
        assert_eq!(credited(&c, 2048, Modelfile::NumCtx(2048)), want);
        // A Modelfile num_ctx other than the loaded one credits no unset kind.
        assert_eq!(
            credited(&c, 4096, Modelfile::NumCtx(2048)),
            [s(kind(Some(4096), Family::Api))]
        );
        assert_eq!(
            credited(&c, 4096, Modelfile::Unknown),
            [s(kind(Some(4096), Family::Api))]
        );
    }

    #[test]
    fn a_learned_kind_is_credited_on_its_learned_context_only() {
        // RES-05 (a), RES-07, RES-08 (/v1 and default num_ctx are learned).
        let mut c = LearnedContexts::default();
        let v1 = kind(None, Family::V1);
        let learned = c.learn(&v1, D, 4096, Modelfile::Unset);
        assert_eq!(
            learned,
            Learned {
                context: 4096,
                parallel: false,
                forgot_old_digest: false
            }
        );
        assert!(credited(&c, 4096, Modelfile::Unset).contains(&s(v1.clone())));
        // RES-11: reloaded differently (another context): charged in full.
        assert!(!credited(&c, 8192, Modelfile::Unset).contains(&s(v1)));
    }

    #[test]
    fn a_learned_context_that_differs_overrides_the_modelfile_and_explicit_rules() {
        // RES-11: the model was since reloaded differently.
        let mut c = LearnedContexts::default();
        let unset = kind(None, Family::Api);
        c.learn(&unset, D, 8192, Modelfile::Unset);
        // The Modelfile now says 2048 and 2048 is loaded, but this kind was seen at 8192.
        let credit = credited(&c, 2048, Modelfile::NumCtx(2048));
        assert!(!credit.contains(&s(unset)), "{credit:?}");
        assert!(credit.contains(&s(kind(None, Family::V1))));
    }

    #[test]
    fn parallel_slots_leave_only_learned_contexts() {
        // RES-08, RES-10: 4 slots × 2048 = 8192 loaded for a num_ctx 2048 request.
        let mut c = LearnedContexts::default();
        let k = kind(Some(2048), Family::Api);
        let learned = c.learn(&k, D, 8192, Modelfile::Unset);
        assert!(learned.parallel);
        assert_eq!(credited(&c, 8192, Modelfile::NumCtx(8192)), [s(k.clone())]);
        // An explicit num_ctx 8192 would be credited without the parallel flag.
        let fresh = LearnedContexts::default();
        assert!(
            credited(&fresh, 8192, Modelfile::Unset).contains(&s(kind(Some(8192), Family::Api)))
        );
        // Parallel detection through the Modelfile for an unset kind.
        let mut c = LearnedContexts::default();
        assert!(
            c.learn(&kind(None, Family::V1), D, 6144, Modelfile::NumCtx(2048))
                .parallel
        );
        match c.evidence(M, D, 2048, Modelfile::NumCtx(2048)) {
            ResidencyEvidence::ProvenFor { kinds, otherwise } => {
                assert!(kinds.is_empty(), "{kinds:?}");
                assert!(otherwise.contains("parallel slots seen"), "{otherwise}");
            }
            other => panic!("{other:?}"),
        }
        // A context capped below the request is not parallel.
        let mut c = LearnedContexts::default();
        assert!(
            !c.learn(
                &kind(Some(200_000), Family::Api),
                D,
                131_072,
                Modelfile::Unset
            )
            .parallel
        );
    }

    #[test]
    fn up_to_eight_kinds_per_model_survive() {
        // RES-12
        let mut c = LearnedContexts::default();
        for n in 1..=10u64 {
            c.learn(
                &kind(Some(n * 1000), Family::Api),
                D,
                n * 1000,
                Modelfile::Unset,
            );
        }
        let kinds = &c.models[M].kinds;
        assert_eq!(kinds.len(), MAX_KINDS_PER_MODEL);
        assert_eq!(kinds[0].num_ctx, Some(3000));
        assert_eq!(kinds[7].num_ctx, Some(10_000));
        // Relearning a kind moves it to the newest place instead of duplicating it.
        c.learn(&kind(Some(3000), Family::Api), D, 3000, Modelfile::Unset);
        let kinds = &c.models[M].kinds;
        assert_eq!(kinds.len(), MAX_KINDS_PER_MODEL);
        assert_eq!(kinds[7].num_ctx, Some(3000));
    }

    #[test]
    fn a_new_digest_forgets_the_model() {
        // RES-14
        let mut c = LearnedContexts::default();
        let k = kind(None, Family::Api);
        c.learn(&k, D, 4096, Modelfile::Unset);
        assert!(!c.note_digest(M, D));
        // Contexts of another digest never count.
        match c.evidence(M, "sha256:bbb", 4096, Modelfile::Unset) {
            ResidencyEvidence::ProvenFor { kinds, .. } => assert!(!kinds.contains(&s(k.clone()))),
            other => panic!("{other:?}"),
        }
        assert!(c.note_digest(M, "sha256:bbb"));
        assert!(c.models.is_empty());
        let learned = {
            c.learn(&k, D, 4096, Modelfile::Unset);
            c.learn(&k, "sha256:ccc", 4096, Modelfile::Unset)
        };
        assert!(learned.forgot_old_digest);
        assert_eq!(c.models[M].digest, "sha256:ccc");
    }

    #[test]
    fn models_are_bounded() {
        let mut c = LearnedContexts::default();
        for i in 0..(MAX_MODELS + 5) {
            let k = RequestKind {
                model: format!("m{i}:latest"),
                num_ctx: None,
                family: Family::Api,
            };
            c.learn(&k, D, 4096, Modelfile::Unset);
        }
        assert_eq!(c.models.len(), MAX_MODELS);
        assert!(!c.models.contains_key("m0:latest"));
        assert!(
            c.models
                .contains_key(&format!("m{}:latest", MAX_MODELS + 4))
        );
    }

    #[test]
    fn the_refusal_reason_names_what_is_known() {
        // RES-21
        let mut c = LearnedContexts::default();
        c.learn(&kind(None, Family::Api), D, 8192, Modelfile::Unset);
        let ResidencyEvidence::ProvenFor { otherwise, .. } =
            c.evidence(M, D, 4096, Modelfile::NumCtx(2048))
        else {
            panic!();
        };
        assert!(
            otherwise.contains("loaded with context 4096"),
            "{otherwise}"
        );
        assert!(
            otherwise.contains("num_ctx unset /api → 8192"),
            "{otherwise}"
        );
        assert!(otherwise.contains("Modelfile num_ctx 2048"), "{otherwise}");
    }
}
