//! Failed control-plane authentications: counted, logged without flooding
//! the log, and slowed per peer (issue 30 item 7).
//!
//! # Behavior
//!
//! - **Counted**: every refused token is counted in
//!   `vacancyd_auth_failures_total{scope, reason}` (the scope the call
//!   needed; `wrong_token`, `missing_token` or `insufficient_scope`).
//! - **Logged**: a peer's first failure is logged at once with the peer's
//!   address; after that, at most one line a peer a [`LOG_EVERY`] saying how
//!   many more there were, and at most [`LOG_BURST`] such lines in all per
//!   [`LOG_EVERY`] (the next line says how many were not logged).
//! - **Slowed**: after [`FREE_FAILURES`] wrong tokens from one peer, each
//!   further wrong token is answered only after a delay that doubles from
//!   250 ms up to [`MAX_DELAY`], the answers of one peer spaced out one after
//!   another however many connections it opens. A peer is forgotten
//!   [`FORGET_AFTER`] after its last failure. Loopback addresses count as
//!   one peer, so a local account cannot spread over 127.0.0.0/8.
//! - **Never locked out**: a valid token is checked first and answered at
//!   once, from any peer, slowed or not: the owner on loopback keeps the
//!   console while another local account guesses. A connection waiting out
//!   a delay counts as idle, so the control listener may close it to make
//!   room ([`conns`](super::conns)).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;
use tracing::warn;
use vacancy::config::Scope;

use super::conns::peer_key;

/// Wrong tokens a peer may send before it is slowed.
pub const FREE_FAILURES: u32 = 10;
/// The longest one wrong token's answer is delayed.
pub const MAX_DELAY: Duration = Duration::from_secs(10);
/// The first delay, doubled with each further wrong token.
const FIRST_DELAY: Duration = Duration::from_millis(250);
/// How long after its last failure a peer is forgotten.
pub const FORGET_AFTER: Duration = Duration::from_secs(600);
/// How often a peer's failures are logged, at most.
pub const LOG_EVERY: Duration = Duration::from_secs(60);
/// Lines about failures logged per [`LOG_EVERY`], whatever the peers.
pub const LOG_BURST: u32 = 20;
/// Peers remembered at once; the ones whose last failure is oldest go first.
const MAX_PEERS: usize = 4096;

/// Why a call was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// A bearer token that matches no configured hash.
    WrongToken,
    /// No `Authorization: Bearer` header.
    MissingToken,
    /// A valid token without the scope the call needs.
    InsufficientScope,
}

impl Failure {
    /// The metric's `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            Failure::WrongToken => "wrong_token",
            Failure::MissingToken => "missing_token",
            Failure::InsufficientScope => "insufficient_scope",
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Peer {
    wrong: u32,
    last: Instant,
    /// When the next slowed answer may go out: answers are spaced out.
    next_answer: Instant,
    logged_at: Option<Instant>,
    unlogged: u64,
}

#[derive(Debug)]
struct State {
    peers: HashMap<IpAddr, Peer>,
    window_start: Instant,
    lines: u32,
    suppressed: u64,
}

/// The failures of every peer (see the [module docs](self)).
#[derive(Debug)]
pub struct AuthFailures {
    state: Mutex<State>,
}

impl Default for AuthFailures {
    fn default() -> Self {
        AuthFailures {
            state: Mutex::new(State {
                peers: HashMap::new(),
                window_start: Instant::now(),
                lines: 0,
                suppressed: 0,
            }),
        }
    }
}

/// The key failures are counted under: one for all of loopback, else the
/// connection pools' key (the address, or an IPv6 /64).
fn failure_key(peer: IpAddr) -> IpAddr {
    let key = peer_key(peer);
    if key.is_loopback() {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        key
    }
}

impl AuthFailures {
    fn lock(&self) -> MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Note one refused call from `peer` that needed `scope`: log it as the
    /// [module docs](self) say, and return how long to wait before
    /// answering (zero unless the peer is slowed).
    pub fn failed(&self, peer: IpAddr, scope: Scope, failure: Failure) -> Duration {
        let now = Instant::now();
        let key = failure_key(peer);
        let mut s = self.lock();
        if now.saturating_duration_since(s.window_start) >= LOG_EVERY {
            s.window_start = now;
            s.lines = 0;
        }
        if !s.peers.contains_key(&key) && s.peers.len() >= MAX_PEERS {
            forget_oldest(&mut s.peers, now);
        }
        let peer_state = s.peers.entry(key).or_insert(Peer {
            wrong: 0,
            last: now,
            next_answer: now,
            logged_at: None,
            unlogged: 0,
        });
        if now.saturating_duration_since(peer_state.last) >= FORGET_AFTER {
            *peer_state = Peer {
                wrong: 0,
                last: now,
                next_answer: now,
                logged_at: None,
                unlogged: 0,
            };
        }
        peer_state.last = now;
        let mut delay = Duration::ZERO;
        if failure == Failure::WrongToken {
            peer_state.wrong = peer_state.wrong.saturating_add(1);
            if peer_state.wrong > FREE_FAILURES {
                let doublings = (peer_state.wrong - FREE_FAILURES - 1).min(16);
                let step = FIRST_DELAY.saturating_mul(1 << doublings).min(MAX_DELAY);
                // Spaced out: each answer a step after the previous one.
                let at = peer_state.next_answer.max(now) + step;
                peer_state.next_answer = at;
                delay = at.saturating_duration_since(now);
            }
        }
        let due = peer_state
            .logged_at
            .is_none_or(|t| now.saturating_duration_since(t) >= LOG_EVERY);
        if !due {
            peer_state.unlogged += 1;
            return delay;
        }
        let (wrong, since) = (peer_state.wrong, peer_state.unlogged);
        if s.lines >= LOG_BURST {
            s.suppressed += 1;
            if let Some(p) = s.peers.get_mut(&key) {
                p.unlogged += 1;
            }
            return delay;
        }
        let suppressed = std::mem::take(&mut s.suppressed);
        s.lines += 1;
        if let Some(p) = s.peers.get_mut(&key) {
            p.logged_at = Some(now);
            p.unlogged = 0;
        }
        drop(s);
        warn!(
            %peer,
            scope = scope.as_str(),
            reason = failure.label(),
            more_since_last_line = since,
            wrong_tokens_from_peer = wrong,
            slowed_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            other_lines_not_logged = suppressed,
            "control plane: a call was refused for its token (counted in vacancyd_auth_failures_total); repeated wrong tokens from one address are answered ever more slowly"
        );
        delay
    }
}

/// Drop the peer whose last failure is oldest (or every forgotten one).
fn forget_oldest(peers: &mut HashMap<IpAddr, Peer>, now: Instant) {
    peers.retain(|_, p| now.saturating_duration_since(p.last) < FORGET_AFTER);
    if peers.len() >= MAX_PEERS
        && let Some(oldest) = peers.iter().min_by_key(|(_, p)| p.last).map(|(k, _)| *k)
    {
        peers.remove(&oldest);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn repeated_wrong_tokens_are_slowed_per_peer_and_forgotten_later() {
        // Issue 30 item 7.
        let f = AuthFailures::default();
        let attacker: IpAddr = "10.0.0.9".parse().unwrap();
        for _ in 0..FREE_FAILURES {
            assert_eq!(
                f.failed(attacker, Scope::Owner, Failure::WrongToken),
                Duration::ZERO
            );
        }
        // Then 250 ms, 500 ms, 1 s, ...: each answer spaced after the last.
        let d1 = f.failed(attacker, Scope::Owner, Failure::WrongToken);
        let d2 = f.failed(attacker, Scope::Owner, Failure::WrongToken);
        let d3 = f.failed(attacker, Scope::Owner, Failure::WrongToken);
        assert_eq!(d1, Duration::from_millis(250));
        assert_eq!(d2, Duration::from_millis(750));
        assert_eq!(d3, Duration::from_millis(1750));
        // Up to the cap.
        let mut last = d3;
        for _ in 0..20 {
            let d = f.failed(attacker, Scope::Owner, Failure::WrongToken);
            assert!(d - last <= MAX_DELAY);
            last = d;
        }
        // Other peers, and other kinds of failure, are not slowed.
        let other: IpAddr = "10.0.0.10".parse().unwrap();
        assert_eq!(
            f.failed(other, Scope::Read, Failure::WrongToken),
            Duration::ZERO
        );
        assert_eq!(
            f.failed(attacker, Scope::Admin, Failure::InsufficientScope),
            Duration::ZERO
        );
        // Every loopback address is one peer.
        for i in 0..=FREE_FAILURES {
            let lo = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1 + i as u8));
            let d = f.failed(lo, Scope::Owner, Failure::WrongToken);
            assert_eq!(d.is_zero(), i < FREE_FAILURES, "{lo}");
        }
        // Forgotten after a quiet spell.
        tokio::time::advance(FORGET_AFTER + Duration::from_secs(60)).await;
        assert_eq!(
            f.failed(attacker, Scope::Owner, Failure::WrongToken),
            Duration::ZERO
        );
    }
}
