//! The owner's sign: one state and the words for it, made once from the
//! engine's status, so that every place the owner looks (the console, the
//! Windows tray, `vacancyd status`) says the same (SCOPE-16, SCOPE-17).
//! The console and the tray show these strings as they are; neither
//! composes words of its own.

use serde::Serialize;

use super::status::EngineStatus;
use super::work::Phase;

/// What the owner's machine is doing with its lending, for an icon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SignState {
    /// Held work needs the owner: its completion is uncertain and it keeps
    /// its resources until released (HELD-01).
    Held,
    /// The lending switch is off.
    Paused,
    /// Owner policy pauses host-scoped routes (the owner is present, or
    /// presence is unknown, or a term refuses); exempt routes may still lend.
    OwnerPresent,
    /// Borrowed work is running.
    Lending,
    /// No work runs, and a route would admit (or queue) a request now.
    Admitting,
    /// No work runs and no route would admit a request now (busy GPU,
    /// unknown capacity, a switched-off resource, pressure).
    Refusing,
}

impl SignState {
    /// Every state, for tables and tests.
    pub const ALL: [SignState; 6] = [
        SignState::Held,
        SignState::Paused,
        SignState::OwnerPresent,
        SignState::Lending,
        SignState::Admitting,
        SignState::Refusing,
    ];

    /// The lowercase name used in `/status`.
    pub fn as_str(self) -> &'static str {
        match self {
            SignState::Held => "held",
            SignState::Paused => "paused",
            SignState::OwnerPresent => "owner_present",
            SignState::Lending => "lending",
            SignState::Admitting => "admitting",
            SignState::Refusing => "refusing",
        }
    }
}

/// The sign in words: a headline, the line under it, and what needs the
/// owner's attention.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Sign {
    /// For the icon.
    pub state: SignState,
    /// The lending line: "Lending is paused by its switch", "Only exempt
    /// routes are lending", "Owner policy pauses new work" or "Owner policy
    /// allows new work" (SCOPE-16).
    pub headline: String,
    /// What the headline means now: the veto's reason and the exempt
    /// routes still lending, or which routes admit or run work.
    pub detail: String,
    /// Exempt routes that admit or hold work while owner policy pauses the
    /// rest (SCOPE-16), in configuration order.
    pub exempt_lending: Vec<String>,
    /// Held entries that need the owner, in words; `None` when there are none.
    pub attention: Option<String>,
}

impl Sign {
    /// The headline, the detail and the attention line, one a line: the
    /// text a tray's tooltip and menu show.
    pub fn lines(&self) -> Vec<&str> {
        let mut lines = vec![self.headline.as_str()];
        if !self.detail.is_empty() {
            lines.push(&self.detail);
        }
        if let Some(a) = &self.attention {
            lines.push(a);
        }
        lines
    }
}

/// The sign for `status`.
pub fn sign(status: &EngineStatus) -> Sign {
    let veto = &status.owner_veto;
    let holds_work = |name: &str| status.work.iter().any(|w| w.upstream == name);
    let exempt_lending: Vec<String> = if veto.active && status.lending {
        veto.exempt_upstreams
            .iter()
            .filter(|name| {
                holds_work(name)
                    || status
                        .upstreams
                        .iter()
                        .any(|u| &u.name == *name && u.vacancy.admitting)
            })
            .cloned()
            .collect()
    } else {
        Vec::new()
    };
    let reason = veto.reason.as_deref().unwrap_or("owner present");
    let (headline, detail) = if !status.lending {
        (
            "Lending is paused by its switch",
            "Resume lending to admit new work".to_owned(),
        )
    } else if veto.active && !exempt_lending.is_empty() {
        (
            "Only exempt routes are lending",
            format!(
                "Owner policy pauses host-scoped routes ({reason}); exempt routes still lending: {}",
                exempt_lending.join(", ")
            ),
        )
    } else if veto.active {
        ("Owner policy pauses new work", capitalised(reason))
    } else {
        ("Owner policy allows new work", activity(status))
    };
    let held = status
        .work
        .iter()
        .filter(|w| w.phase == Phase::Held)
        .count();
    let attention = match held {
        0 => None,
        1 => Some(
            "1 held entry needs attention: its work may still be running; release it once it has stopped"
                .to_owned(),
        ),
        n => Some(format!(
            "{n} held entries need attention: their work may still be running; release each once it has stopped"
        )),
    };
    let state = if held > 0 {
        SignState::Held
    } else if !status.lending {
        SignState::Paused
    } else if veto.active {
        SignState::OwnerPresent
    } else if status.work.iter().any(|w| w.phase != Phase::Held) {
        SignState::Lending
    } else if status
        .upstreams
        .iter()
        .any(|u| u.vacancy.admitting || u.vacancy.queueing.is_some())
    {
        SignState::Admitting
    } else {
        SignState::Refusing
    };
    Sign {
        state,
        headline: headline.to_owned(),
        detail,
        exempt_lending,
        attention,
    }
}

/// While owner policy allows work: what runs, else what would be admitted.
/// Held entries are not running work as far as anyone knows: the attention
/// line speaks for them.
fn activity(status: &EngineStatus) -> String {
    let running: Vec<&str> = status
        .work
        .iter()
        .filter(|w| w.phase != Phase::Held)
        .map(|w| w.upstream.as_str())
        .collect();
    if !running.is_empty() {
        let mut routes: Vec<&str> = Vec::new();
        for name in &running {
            if !routes.contains(name) {
                routes.push(name);
            }
        }
        let jobs = match running.len() {
            1 => "1 job".to_owned(),
            n => format!("{n} jobs"),
        };
        return format!("Lending: {jobs} on {}", routes.join(", "));
    }
    let admitting: Vec<&str> = status
        .upstreams
        .iter()
        .filter(|u| u.vacancy.admitting)
        .map(|u| u.name.as_str())
        .collect();
    if admitting.is_empty() {
        "No route is admitting now".to_owned()
    } else {
        format!("Admitting now: {}", admitting.join(", "))
    }
}

fn capitalised(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::inputs::OwnerPresence;
    use crate::engine::refusal::RefusalCode;
    use crate::engine::status::{OwnerVetoStatus, UpstreamStatus, Vacancy, WorkStatus};
    use crate::engine::work::CompletionMethod;

    fn upstream(name: &str, scope: &'static str, vacancy: Vacancy) -> UpstreamStatus {
        UpstreamStatus {
            name: name.to_owned(),
            owner_scope: scope,
            resources: vec!["gpu0".to_owned()],
            vacancy,
            line: Default::default(),
        }
    }

    fn work(upstream: &str, phase: Phase) -> WorkStatus {
        WorkStatus {
            id: "e1".to_owned(),
            upstream: upstream.to_owned(),
            model: None,
            resources: vec!["gpu0".to_owned()],
            age_s: 1,
            completion: CompletionMethod::ResponseEnd,
            phase,
            held_reason: None,
            upstream_ref: None,
            borrower: None,
        }
    }

    fn status(lending: bool, veto: Option<&str>) -> EngineStatus {
        EngineStatus {
            lending,
            owner: if veto.is_some() {
                OwnerPresence::Present
            } else {
                OwnerPresence::Away
            },
            owner_veto: OwnerVetoStatus {
                active: veto.is_some(),
                reason: veto.map(str::to_owned),
                exempt_upstreams: vec!["helper".to_owned()],
            },
            resources: Vec::new(),
            upstreams: vec![
                upstream("llama", "host", Vacancy::admitting()),
                upstream(
                    "helper",
                    "resource",
                    Vacancy::refusing(RefusalCode::ResourceBusy, "busy"),
                ),
            ],
            work: Vec::new(),
            reclaims: Vec::new(),
            terms: Vec::new(),
            borrowers: Vec::new(),
        }
    }

    // SCOPE-16: an exempt route that admits while the veto holds.
    #[test]
    fn scope_16_only_exempt_routes_are_lending_names_them() {
        let mut s = status(true, Some("the owner is present"));
        s.upstreams[1].vacancy = Vacancy::admitting();
        let sign = sign(&s);
        assert_eq!(sign.state, SignState::OwnerPresent);
        assert_eq!(sign.headline, "Only exempt routes are lending");
        assert_eq!(
            sign.detail,
            "Owner policy pauses host-scoped routes (the owner is present); exempt routes still lending: helper"
        );
        assert_eq!(sign.exempt_lending, vec!["helper".to_owned()]);
    }

    // SCOPE-16: an exempt route that holds work (but admits nothing new).
    #[test]
    fn scope_16_an_exempt_route_holding_work_is_lending() {
        let mut s = status(true, Some("the owner is present"));
        s.work.push(work("helper", Phase::Tracking));
        assert_eq!(sign(&s).headline, "Only exempt routes are lending");
    }

    // SCOPE-16: with no exempt route lending, the veto pauses new work.
    #[test]
    fn scope_16_owner_policy_pauses_new_work_with_its_reason() {
        let sign = sign(&status(true, Some("the owner is present")));
        assert_eq!(sign.state, SignState::OwnerPresent);
        assert_eq!(sign.headline, "Owner policy pauses new work");
        assert_eq!(sign.detail, "The owner is present");
        assert!(sign.exempt_lending.is_empty());
    }

    #[test]
    fn the_switch_comes_before_the_veto() {
        let mut s = status(false, Some("the owner is present"));
        s.upstreams[1].vacancy = Vacancy::admitting();
        let sign = sign(&s);
        assert_eq!(sign.state, SignState::Paused);
        assert_eq!(sign.headline, "Lending is paused by its switch");
        assert!(sign.exempt_lending.is_empty());
    }

    #[test]
    fn owner_away_admitting_lending_and_refusing() {
        let idle = sign(&status(true, None));
        assert_eq!(idle.state, SignState::Admitting);
        assert_eq!(idle.headline, "Owner policy allows new work");
        assert_eq!(idle.detail, "Admitting now: llama");

        let mut s = status(true, None);
        s.work.push(work("llama", Phase::Forwarding));
        s.work.push(work("llama", Phase::Tracking));
        let busy = sign(&s);
        assert_eq!(busy.state, SignState::Lending);
        assert_eq!(busy.detail, "Lending: 2 jobs on llama");

        let mut s = status(true, None);
        s.upstreams[0].vacancy = Vacancy::refusing(RefusalCode::CapacityUnknown, "no sample");
        let refusing = sign(&s);
        assert_eq!(refusing.state, SignState::Refusing);
        assert_eq!(refusing.detail, "No route is admitting now");
    }

    // HELD-01: held work is the owner's to release; the sign says so first.
    #[test]
    fn held_work_needs_attention_whatever_else_holds() {
        let mut s = status(false, Some("the owner is present"));
        s.work.push(work("llama", Phase::Held));
        let sign = sign(&s);
        assert_eq!(sign.state, SignState::Held);
        assert_eq!(sign.headline, "Lending is paused by its switch");
        assert_eq!(sign.detail, "Resume lending to admit new work");
        assert_eq!(
            sign.attention.as_deref(),
            Some(
                "1 held entry needs attention: its work may still be running; release it once it has stopped"
            )
        );
        assert_eq!(sign.lines().len(), 3);

        // Held work is not counted as running.
        let mut s = status(true, None);
        s.work.push(work("llama", Phase::Held));
        assert_eq!(super::sign(&s).detail, "Admitting now: llama");
    }
}
