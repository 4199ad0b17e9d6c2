//! What Ollama shows: the models `GET /api/ps` lists, the Modelfile
//! `num_ctx` of each digest (`POST /api/show`, once), and what was learned of
//! the contexts each request kind leaves loaded (RES-01..15).

use std::collections::HashMap;

use tracing::{debug, info, warn};
use vacancy::engine::{Lesson, ModelObservation, ObservedModel, ResidencyEvidence};
use vacancy::traits::ObserveError;

use super::OllamaAdapter;
use super::contexts::Modelfile;
use super::names::RequestKind;
use super::ps::{self, MIN_UNLOAD_SECS, PsModel, parse_ps};
use super::show::modelfile_num_ctx;
use crate::common::FetchError;

impl OllamaAdapter {
    pub(super) fn modelfiles(&self) -> std::sync::MutexGuard<'_, HashMap<String, Modelfile>> {
        match self.modelfiles.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// The Modelfile `num_ctx` of the model with `digest`, read from
    /// `/api/show` the first time the digest is seen (RES-09).
    async fn modelfile(&self, reported: &str, digest: &str) -> Modelfile {
        if let Some(known) = self.modelfiles().get(digest) {
            return *known;
        }
        let read = match self
            .core
            .observer()
            .post_json("/api/show", &serde_json::json!({ "model": reported }))
            .await
        {
            Ok(v) => modelfile_num_ctx(&v),
            // Not reachable now: ask again on the next observation.
            Err(FetchError::Unreachable(why)) => {
                debug!(upstream = %self.upstream, model = %reported, error = %why, "POST /api/show unreachable; Modelfile num_ctx unknown for now");
                return Modelfile::Unknown;
            }
            Err(e) => Err(e.to_string()),
        };
        let modelfile = read.unwrap_or_else(|why| {
            warn!(upstream = %self.upstream, model = %reported, error = %why, "unusable /api/show answer; the Modelfile num_ctx rule gives no credit for this digest");
            Modelfile::Unknown
        });
        self.modelfiles().insert(digest.to_owned(), modelfile);
        modelfile
    }

    /// The evidence for one loaded model (RES-03, RES-05).
    fn evidence(&self, m: &PsModel, modelfile: Modelfile) -> ResidencyEvidence {
        if m.unloads_in < MIN_UNLOAD_SECS {
            return ResidencyEvidence::NotProven(format!("unloads in {} s", m.unloads_in.max(0)));
        }
        let Some(loaded) = m.context_length else {
            // Ollama added context_length to /api/ps in 0.10.0: on older
            // releases (0.5.4, 0.9.3) nothing is ever credited.
            return ResidencyEvidence::NotProven(format!(
                "Ollama's /api/ps reports no context_length for {} (releases before 0.10.0 report none), so no request is known to reuse the loaded context",
                m.name
            ));
        };
        let Some(digest) = &m.digest else {
            return ResidencyEvidence::NotProven(format!(
                "Ollama's /api/ps reports no digest for {}, so what was learned of its contexts cannot be matched to this build",
                m.name
            ));
        };
        self.cache.read(&self.upstream, |c| {
            c.evidence(&m.name, digest, loaded, modelfile)
        })
    }

    /// [`vacancy::traits::Adapter::observe`]: `GET /api/ps`, then `POST /api/show`
    /// for each digest not read before (RES-09).
    pub(super) async fn observe_now(&self) -> Result<ModelObservation, ObserveError> {
        let taken_at = self.core.settings().clock.now();
        let ps = self.core.observer().get_json("/api/ps").await?;
        let listed = parse_ps(&ps, ps::unix_now())?;
        let mut models = Vec::with_capacity(listed.len());
        for m in &listed {
            let modelfile = match &m.digest {
                Some(digest) => {
                    let forgot = self
                        .cache
                        .update(&self.upstream, |c| c.note_digest(&m.name, digest));
                    if let Err(e) = forgot {
                        warn!(upstream = %self.upstream, error = %e, "could not write the learned-contexts cache");
                    }
                    self.modelfile(&m.reported, digest).await
                }
                None => Modelfile::Unknown,
            };
            models.push(ObservedModel {
                digest: m.digest.clone(),
                context_length: m.context_length,
                ..ObservedModel::new(m.name.clone(), self.evidence(m, modelfile))
            });
        }
        Ok(ModelObservation {
            taken_at,
            models,
            visible_work: None,
            allocator_free_mib: None,
        })
    }

    /// [`vacancy::traits::Adapter::learn`]: the lesson's kind gets the context
    /// the observation shows, under its digest (RES-07).
    pub(super) async fn learn_now(&self, lesson: &Lesson, observation: &mut ModelObservation) {
        let kind: RequestKind = match lesson.kind.parse() {
            Ok(k) => k,
            Err(e) => {
                warn!(upstream = %self.upstream, error = %e, "a lesson with a kind this adapter did not write; nothing learned");
                return;
            }
        };
        let Some(m) = observation.models.iter_mut().find(|m| m.name == kind.model) else {
            debug!(upstream = %self.upstream, kind = %kind, "the model was not loaded after the request; nothing learned");
            return;
        };
        let (Some(digest), Some(loaded)) = (m.digest.clone(), m.context_length) else {
            debug!(upstream = %self.upstream, kind = %kind, "no digest or context_length in /api/ps; nothing learned");
            return;
        };
        let modelfile = self
            .modelfiles()
            .get(&digest)
            .copied()
            .unwrap_or(Modelfile::Unknown);
        let mut learned = None;
        let written = self.cache.update(&self.upstream, |c| {
            learned = Some(c.learn(&kind, &digest, loaded, modelfile));
            true
        });
        if let Err(e) = written {
            warn!(upstream = %self.upstream, error = %e, "could not write the learned-contexts cache; the lesson is kept in memory");
        }
        if let Some(l) = learned {
            info!(upstream = %self.upstream, kind = %kind, context = l.context, parallel = l.parallel, "learned the context a request kind leaves loaded");
        }
        // The evidence changes only where the other proofs (unload time,
        // digest, context) already held.
        if matches!(m.evidence, ResidencyEvidence::ProvenFor { .. }) {
            m.evidence = self.cache.read(&self.upstream, |c| {
                c.evidence(&m.name, &digest, loaded, modelfile)
            });
        }
    }
}
