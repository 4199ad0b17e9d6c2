//! What a ComfyUI submission becomes: the same prompt under the ID vacancy
//! assigns (its entry ID), remembered for the borrower's reads (COMFY-01..05).

use vacancy::engine::RequestReuse;
use vacancy::traits::{InspectContext, InspectError, InspectResult, Inspection};

use super::{ComfyUiAdapter, lock, submission};

impl ComfyUiAdapter {
    /// [`vacancy::traits::Adapter::inspect`] for `POST /prompt`: the body
    /// rewritten under the assigned `prompt_id`, or 400 `invalid_submission`.
    pub(super) fn inspect_submission(&self, ctx: InspectContext<'_>, body: &[u8]) -> InspectResult {
        let assigned = ctx.entry.to_string();
        let rewritten = submission::with_prompt_id(body, &assigned).map_err(|why| InspectError {
            code: vacancy::RefusalCode::InvalidSubmission,
            message: format!(
                "{why}; POST a JSON object such as {{\"prompt\": {{...}}}} (ComfyUI could never queue this)"
            ),
        })?;
        {
            let mut borrowed = lock(&self.shared.borrowed);
            borrowed.remember(&assigned);
            if let Some(asked) = &rewritten.requested {
                borrowed.remember_requested(asked, &assigned);
            }
        }
        Ok(Inspection {
            model: None,
            canonical_model: None,
            reuse: RequestReuse::Cannot("ComfyUI work is charged as a load (RES-18)".to_owned()),
            rewritten_body: Some(rewritten.body),
            upstream_ref: Some(assigned),
        })
    }
}
