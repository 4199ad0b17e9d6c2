//! The output-sanity gate of a slot load: one greedy completion whose answer is
//! known ("The capital of France is" → "Paris"), asked of a llama-server that
//! already answers `/health`, before the slot may be published as READY.
//!
//! `/health` proves the runner bound its port and mapped its weights, not that
//! its backend turns them into language; a mis-computing GPU backend answers
//! `/health` and streams garbage. [`check_output_sanity`] asks, judges and says
//! what the slot becomes ([`GateOutcome::next_state`]).
//!
//! Rule IDs are those of the GATE section of the rule catalog (seed 002).
//!
//! ```no_run
//! # async fn load() {
//! use vacancy::gate::{GateNextState, GateOptions, check_output_sanity};
//!
//! let outcome = check_output_sanity("http://127.0.0.1:8080", &GateOptions::cpu()).await;
//! match outcome.next_state() {
//!     GateNextState::Ready => { /* publish READY, clear an earlier verdict */ }
//!     GateNextState::Warming => { /* stay WARMING; the next load re-runs the gate */ }
//!     GateNextState::Error => { /* ERROR with outcome.to_string(); stop the unit */ }
//! }
//! # }
//! ```

mod http;
mod judge;

use std::fmt;
use std::time::Duration;

use serde_json::{Value, json};

pub use judge::{Stripped, gives_expected, strip_think};

/// The raw completion's prompt (GATE-02).
pub const PROMPT: &str = "The capital of France is";

/// The chat retry's user message: the same known-answer question, worded for
/// an instruction-tuned model (GATE-04).
pub const CHAT_PROMPT: &str = "Complete the sentence with one word: The capital of France is";

/// The known answer (GATE-02).
pub const EXPECTED: &str = "Paris";

/// The error code a load refused by the gate carries (GATE-05 reading, SERR-04).
pub const ERROR_CODE: &str = "SlotOutputSanityFailed";

/// The HTTP status of [`ERROR_CODE`] (SERR-04).
pub const ERROR_STATUS: u16 = 500;

/// Which endpoint a probe went through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Probe {
    /// The raw, greedy `POST /completion` (llama-server's native API).
    Completion,
    /// The one retry, `POST /v1/chat/completions`.
    ChatCompletions,
}

impl Probe {
    /// The request path, e.g. `/completion`.
    pub fn path(self) -> &'static str {
        match self {
            Probe::Completion => "/completion",
            Probe::ChatCompletions => "/v1/chat/completions",
        }
    }
}

impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "POST {}", self.path())
    }
}

/// The device lane of the slot, which sets the time budget (GATE-10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lane {
    /// A GPU or other accelerated backend.
    Accelerated,
    /// A `device = "cpu"` slot: decodes far slower, so it gets a wider budget.
    Cpu,
}

impl Lane {
    /// The lane of a slot's `device` value: `"cpu"` (any ASCII case) is
    /// [`Lane::Cpu`], anything else [`Lane::Accelerated`].
    pub fn for_device(device: &str) -> Lane {
        if device.trim().eq_ignore_ascii_case("cpu") {
            Lane::Cpu
        } else {
            Lane::Accelerated
        }
    }
}

/// How to run the gate: its budget and what to send.
///
/// # Behavior
/// - GATE-10: [`GateOptions::cpu`] has the same token limits as
///   [`GateOptions::accelerated`] (the answer is judged the same) but six times
///   the wall clock, so slow hardware is judged on its answer, not its speed.
///   The rules give no numbers (GATE-10 ambiguity); these are this crate's.
/// - GATE-04: the chat retry's token limit leaves room for a `<think>` block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateOptions {
    /// The lane the budget was made for.
    pub lane: Lane,
    /// Tokens the raw completion may generate (`n_predict`).
    pub completion_tokens: u32,
    /// Wall clock for the raw completion, connect to last byte.
    pub completion_timeout: Duration,
    /// Tokens the chat retry may generate (`max_tokens`), `<think>` included.
    pub chat_tokens: u32,
    /// Wall clock for the chat retry, connect to last byte.
    pub chat_timeout: Duration,
    /// `model` of the chat request, for servers that want one (llama-server
    /// ignores it). Default none: the field is left out.
    pub model: Option<String>,
    /// An `Authorization` header value (e.g. `Bearer KEY`) for a keyed server.
    pub authorization: Option<String>,
}

impl GateOptions {
    /// Tokens for the raw completion: the answer is the first word or two.
    pub const COMPLETION_TOKENS: u32 = 16;
    /// Tokens for the chat retry: room for a reasoning model's `<think>` block.
    pub const CHAT_TOKENS: u32 = 1024;

    /// The accelerated lane's budget: 30 s for the completion, 120 s for the
    /// chat retry.
    pub fn accelerated() -> Self {
        Self {
            lane: Lane::Accelerated,
            completion_tokens: Self::COMPLETION_TOKENS,
            completion_timeout: Duration::from_secs(30),
            chat_tokens: Self::CHAT_TOKENS,
            chat_timeout: Duration::from_secs(120),
            model: None,
            authorization: None,
        }
    }

    /// The CPU lane's budget (GATE-10): the same tokens, six times the wall
    /// clock — 180 s for the completion, 720 s for the chat retry.
    pub fn cpu() -> Self {
        Self {
            lane: Lane::Cpu,
            completion_timeout: Duration::from_secs(180),
            chat_timeout: Duration::from_secs(720),
            ..Self::accelerated()
        }
    }

    /// The budget for a slot's `device` value ([`Lane::for_device`]).
    pub fn for_device(device: &str) -> Self {
        match Lane::for_device(device) {
            Lane::Cpu => Self::cpu(),
            Lane::Accelerated => Self::accelerated(),
        }
    }

    /// The longest the gate can take: both probes' wall clocks (what a load's
    /// client timeout charges for the gate, SLOTCFG-20).
    pub fn worst_case(&self) -> Duration {
        self.completion_timeout + self.chat_timeout
    }
}

impl Default for GateOptions {
    fn default() -> Self {
        Self::accelerated()
    }
}

/// What one probe heard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heard {
    /// The endpoint asked.
    pub probe: Probe,
    /// What the model said: for the chat retry, the answer with its `<think>`
    /// block taken out.
    pub said: String,
}

/// The gate's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateOutcome {
    /// The model said the expected word (GATE-02) through `probe`.
    Passed {
        /// The probe that heard it: the raw completion, or the chat retry.
        probe: Probe,
        /// What the model said.
        answer: String,
    },
    /// Both probes answered, neither with the expected word (GATE-04, GATE-05).
    Wrong {
        /// The expected token, `"Paris"`.
        expected: String,
        /// What the model said last (the chat retry's answer).
        actual: String,
        /// The probe that heard `actual`.
        probe: Probe,
        /// Everything heard, in order: the raw completion, then the retry.
        heard: Vec<Heard>,
    },
    /// No answer to judge (GATE-09): a timeout, refused connection, non-2xx
    /// reply, malformed JSON, or a `<think>` block cut off by the token limit.
    Unanswered {
        /// The probe that did not answer.
        probe: Probe,
        /// Why, e.g. `POST http://…/completion: no reply within 30.0 s`.
        reason: String,
        /// What was heard before (a wrong raw completion, when the retry is the
        /// probe that did not answer).
        heard: Vec<Heard>,
    },
}

/// The slot state a gate outcome leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GateNextState {
    /// Publish the slot as READY.
    Ready,
    /// Keep the slot WARMING; publish nothing, stamp nothing, leave the unit.
    Warming,
    /// The load is refused: ERROR.
    Error,
}

impl GateOutcome {
    /// The state the slot takes after the gate.
    ///
    /// # Behavior
    /// - GATE-01/SLOT-05: only [`GateOutcome::Passed`] leads to READY.
    /// - GATE-05: [`GateOutcome::Wrong`] leads to ERROR (terminal for the load).
    /// - GATE-09: [`GateOutcome::Unanswered`] leads to WARMING, never READY.
    pub fn next_state(&self) -> GateNextState {
        match self {
            GateOutcome::Passed { .. } => GateNextState::Ready,
            GateOutcome::Wrong { .. } => GateNextState::Error,
            GateOutcome::Unanswered { .. } => GateNextState::Warming,
        }
    }

    /// Whether the gate passed.
    pub fn passed(&self) -> bool {
        matches!(self, GateOutcome::Passed { .. })
    }

    /// Whether the slot's unit is to be stopped (best effort; a stop that does
    /// not return belongs in the same error message).
    ///
    /// # Behavior
    /// - GATE-06: yes after a wrong answer.
    /// - GATE-09: never for an unanswered probe — the unit is left alone.
    pub fn stops_unit(&self) -> bool {
        matches!(self, GateOutcome::Wrong { .. })
    }

    /// Whether this outcome records a failed-gate verdict that keeps the slot
    /// from being re-adopted as READY by a later poll or the boot reconcile.
    ///
    /// # Behavior
    /// - GATE-07: yes after a wrong answer.
    /// - GATE-09: an unanswered probe stamps nothing.
    pub fn records_verdict(&self) -> bool {
        matches!(self, GateOutcome::Wrong { .. })
    }

    /// Whether this outcome clears an earlier failed-gate verdict.
    ///
    /// # Behavior
    /// - GATE-08: only a passing gate on a later load clears it.
    pub fn clears_verdict(&self) -> bool {
        self.passed()
    }

    /// The error the load call returns: `Some((500, "SlotOutputSanityFailed"))`
    /// after a wrong answer, else none.
    ///
    /// # Behavior
    /// - GATE-05 (reading) and SERR-04.
    pub fn load_error(&self) -> Option<(u16, &'static str)> {
        matches!(self, GateOutcome::Wrong { .. }).then_some((ERROR_STATUS, ERROR_CODE))
    }
}

/// The message of the outcome; for [`GateOutcome::Wrong`] it names the probe,
/// the expected token and what the model actually said (GATE-05).
impl fmt::Display for GateOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GateOutcome::Passed { probe, answer } => write!(
                f,
                "output-sanity probe passed: {probe} answered {:?} (expected {EXPECTED:?})",
                http::snippet(answer)
            ),
            GateOutcome::Wrong {
                expected,
                actual,
                probe,
                heard,
            } => {
                write!(
                    f,
                    "output-sanity probe failed: {probe} answered {:?}, expected {expected:?}",
                    http::snippet(actual)
                )?;
                for h in heard.iter().filter(|h| h.probe != *probe) {
                    write!(f, "; {} answered {:?}", h.probe, http::snippet(&h.said))?;
                }
                Ok(())
            }
            GateOutcome::Unanswered {
                probe,
                reason,
                heard,
            } => {
                write!(f, "output-sanity probe unanswered: {probe}: {reason}")?;
                for h in heard {
                    write!(f, "; {} answered {:?}", h.probe, http::snippet(&h.said))?;
                }
                Ok(())
            }
        }
    }
}

/// What one probe got back.
enum Reply {
    /// An answer to judge.
    Said(String),
    /// No answer, and why.
    NoAnswer(String),
}

/// Runs the output-sanity gate against the llama-server at `base_url`
/// (`http://host:port`, plus an API prefix if it has one).
///
/// Asks `POST /completion` for a greedy (`temperature` 0) continuation of
/// [`PROMPT`]; if the answer does not give [`EXPECTED`], retries once through
/// `POST /v1/chat/completions` with [`CHAT_PROMPT`] and the wider token limit,
/// takes the `<think>` block out, and judges again. It never panics: every HTTP
/// failure is an [`GateOutcome::Unanswered`] with the reason. Run it on a Tokio
/// runtime with its time driver enabled (the budget is a Tokio timeout).
///
/// # Behavior
/// - GATE-02: one greedy completion of "The capital of France is", expecting
///   "Paris" (judged by [`gives_expected`]: whole word, any case, anywhere).
/// - GATE-04: a wrong answer on `/completion` buys exactly one retry through
///   `/v1/chat/completions`, with room for a `<think>` block, which is
///   stripped ([`strip_think`]) before judging. Only a *wrong* answer buys
///   the retry: an unanswered `/completion` ends the gate (reading).
/// - GATE-05: both answers wrong → [`GateOutcome::Wrong`] naming the probe,
///   the expected token and the actual answer.
/// - GATE-09: no answer within the budget (timeout, refused connection,
///   non-2xx, malformed JSON, `<think>` cut off by the token limit) →
///   [`GateOutcome::Unanswered`]; also when the retry itself goes unanswered
///   after a wrong completion (reading: the verdict is the retry's, and an
///   inconclusive gate is never READY and never terminal).
/// - GATE-10: the budget is `opts` ([`GateOptions::cpu`] for a CPU slot).
/// - GATE-01/03/11–14 (which slots are gated, when, under the lock) are the
///   caller's; [`is_gated`] decides the first.
pub async fn check_output_sanity(base_url: &str, opts: &GateOptions) -> GateOutcome {
    let first = ask_completion(base_url, opts).await;
    let said = match first {
        Reply::NoAnswer(reason) => {
            return finish(GateOutcome::Unanswered {
                probe: Probe::Completion,
                reason,
                heard: Vec::new(),
            });
        }
        Reply::Said(said) => said,
    };
    if gives_expected(&said, EXPECTED) {
        return finish(GateOutcome::Passed {
            probe: Probe::Completion,
            answer: said,
        });
    }
    tracing::info!(answer = %said, "output-sanity: /completion answered wrong; one chat retry");
    let mut heard = vec![Heard {
        probe: Probe::Completion,
        said,
    }];
    match ask_chat(base_url, opts).await {
        Reply::NoAnswer(reason) => finish(GateOutcome::Unanswered {
            probe: Probe::ChatCompletions,
            reason,
            heard,
        }),
        Reply::Said(said) if gives_expected(&said, EXPECTED) => finish(GateOutcome::Passed {
            probe: Probe::ChatCompletions,
            answer: said,
        }),
        Reply::Said(said) => {
            heard.push(Heard {
                probe: Probe::ChatCompletions,
                said: said.clone(),
            });
            finish(GateOutcome::Wrong {
                expected: EXPECTED.to_string(),
                actual: said,
                probe: Probe::ChatCompletions,
                heard,
            })
        }
    }
}

fn finish(outcome: GateOutcome) -> GateOutcome {
    match outcome.next_state() {
        GateNextState::Ready => tracing::info!(%outcome, "output-sanity gate"),
        GateNextState::Warming | GateNextState::Error => {
            tracing::warn!(%outcome, "output-sanity gate")
        }
    }
    outcome
}

async fn ask_completion(base_url: &str, opts: &GateOptions) -> Reply {
    let url = http::join(base_url, Probe::Completion.path());
    let body = json!({
        "prompt": PROMPT,
        "n_predict": opts.completion_tokens,
        "temperature": 0,
        "top_k": 1,
        "stream": false,
        "cache_prompt": false,
    });
    let timeout = opts.completion_timeout;
    match http::post_json(&url, &body, opts.authorization.as_deref(), timeout).await {
        Err(reason) => Reply::NoAnswer(reason),
        Ok(reply) => completion_content(&reply).map_or_else(
            |reason| Reply::NoAnswer(format!("POST {url}: {reason}")),
            Reply::Said,
        ),
    }
}

async fn ask_chat(base_url: &str, opts: &GateOptions) -> Reply {
    let url = http::join(base_url, Probe::ChatCompletions.path());
    let mut body = json!({
        "messages": [{"role": "user", "content": CHAT_PROMPT}],
        "max_tokens": opts.chat_tokens,
        "temperature": 0,
        "stream": false,
    });
    if let (Some(model), Some(map)) = (&opts.model, body.as_object_mut()) {
        map.insert("model".into(), Value::String(model.clone()));
    }
    let timeout = opts.chat_timeout;
    match http::post_json(&url, &body, opts.authorization.as_deref(), timeout).await {
        Err(reason) => Reply::NoAnswer(reason),
        Ok(reply) => match chat_answer(&reply) {
            Ok(said) => Reply::Said(said),
            Err(reason) => Reply::NoAnswer(format!("POST {url}: {reason}")),
        },
    }
}

/// The `content` of a llama-server `/completion` reply.
fn completion_content(reply: &Value) -> Result<String, String> {
    reply
        .get("content")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| {
            format!(
                "reply has no string \"content\": {}",
                http::snippet(&reply.to_string())
            )
        })
}

/// The answer of an OpenAI chat-completion reply, its `<think>` block taken
/// out; an error when there is none to judge (no message, or reasoning cut
/// off by the token limit — in the text, or as a separate
/// `reasoning_content` with an empty `content` and `finish_reason` "length").
fn chat_answer(reply: &Value) -> Result<String, String> {
    let choice = reply.get("choices").and_then(|c| c.get(0)).ok_or_else(|| {
        format!(
            "reply has no choices[0]: {}",
            http::snippet(&reply.to_string())
        )
    })?;
    let message = choice.get("message").ok_or_else(|| {
        format!(
            "choices[0] has no message: {}",
            http::snippet(&choice.to_string())
        )
    })?;
    let content = match message.get("content") {
        Some(Value::String(s)) => s.as_str(),
        Some(Value::Null) | None => "",
        Some(other) => {
            return Err(format!(
                "message content is not a string: {}",
                http::snippet(&other.to_string())
            ));
        }
    };
    let cut_off = choice.get("finish_reason").and_then(Value::as_str) == Some("length");
    let reasoning = message
        .get("reasoning_content")
        .and_then(Value::as_str)
        .is_some_and(|r| !r.trim().is_empty());
    match strip_think(content) {
        Stripped::Unclosed => {
            Err("the <think> block was cut off by the token limit: no answer".into())
        }
        Stripped::Answer(answer) if answer.is_empty() && reasoning && cut_off => {
            Err("the reasoning was cut off by the token limit: no answer".into())
        }
        Stripped::Answer(answer) => Ok(answer),
    }
}

/// A slot's kind, as far as the gate cares (GATE-01, GATE-11).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SlotType {
    /// `type = "llm"`: chat/completion models.
    Llm,
    /// Embedding models.
    Embedding,
    /// Rerankers.
    Reranking,
    /// Text to speech.
    Tts,
    /// Speech to text.
    Stt,
    /// Image generation.
    Image,
}

/// Where a slot runs (GATE-01, GATE-12).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Runtime {
    /// The container/llama-server lane.
    LlamaServer,
    /// The FLM/NPU lane (it keeps its own `verify_inference` sentinel).
    FlmNpu,
}

/// Whether a load of this slot runs the gate.
///
/// - `box_switch`: the api environment's `HAL0_SLOT_OUTPUT_SANITY` value, if set.
/// - `slot_switch`: the slot's `output_sanity` setting, if set.
///
/// # Behavior
/// - GATE-01: only a `type = "llm"` slot on the llama-server lane is gated.
/// - GATE-11: embedding, reranking, TTS, STT and image slots never are.
/// - GATE-12: the FLM/NPU lane is not.
/// - GATE-13: on by default; `HAL0_SLOT_OUTPUT_SANITY=0` turns it off for the
///   whole box (reading: exactly `0`, surrounding whitespace ignored; any other
///   value leaves it on).
/// - GATE-14: `output_sanity = false` turns it off for the slot.
pub fn is_gated(
    slot_type: SlotType,
    runtime: Runtime,
    box_switch: Option<&str>,
    slot_switch: Option<bool>,
) -> bool {
    slot_type == SlotType::Llm
        && runtime == Runtime::LlamaServer
        && box_switch.is_none_or(|v| v.trim() != "0")
        && slot_switch != Some(false)
}

#[cfg(test)]
mod tests;
