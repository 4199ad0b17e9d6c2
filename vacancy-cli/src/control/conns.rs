//! The control listener's connections: how many, whose, for how long, and
//! the reserve that health checks can always use (issue 30 item 2).
//!
//! # Behavior
//!
//! - **Size**: the control listener's share of the descriptor limit
//!   ([`conn::budgets`](vacancy::shell::proxy::conn::budgets): a sixteenth, 64 to
//!   2048), of which an eighth (at least 8) is the reserve and the rest the
//!   general pool.
//! - **Short limits**: every request head on the control listener arrives
//!   before anything in it is authenticated, so the general pool closes a
//!   head that takes longer than [`HEADER`] and a connection idle longer
//!   than [`IDLE`] (or the configured timeouts, when shorter).
//! - **Per peer**: one address holds at most a quarter of the general pool
//!   (at least 16). A peer at its cap that opens another connection closes
//!   its own oldest connection with no request in flight; one with every
//!   connection busy goes to the reserve.
//! - **Full**: with the general pool full, a new connection closes the
//!   oldest connection with no request in flight, whoever's, so idle and
//!   slowloris connections cannot keep anyone out. With every connection
//!   busy, it goes to the reserve.
//! - **Reserve**: answers one request and closes; only `/health` and
//!   `/health/upstreams/<name>`, within [`RESERVE_LIMIT`] for its head. A
//!   new reserve connection closes the oldest one still waiting for its head,
//!   so a flood of connections that send nothing cannot fill it; a health
//!   check sends its request at once and is answered before it could be
//!   closed.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;
use vacancy::shell::proxy::conn::ConnLimits;

/// The longest a request head may take on a general control connection.
pub const HEADER: Duration = Duration::from_secs(5);
/// The longest a general control connection may stay idle.
pub const IDLE: Duration = Duration::from_secs(10);
/// A reserve connection's whole allowance for its request head.
pub const RESERVE_LIMIT: Duration = Duration::from_secs(2);

/// Which pool a connection was admitted to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pool {
    /// Served as always, under the short limits.
    General,
    /// Health checks only, one request, then closed.
    Reserve,
}

/// Why a connection was closed to make room, for the log and the metric
/// `vacancyd_control_connections_shed_total{reason}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shed {
    /// An idle or slow connection closed for a newer one.
    EvictedIdle,
    /// A reserve connection that had not sent its head, closed for a newer one.
    EvictedReserve,
    /// Sent to the reserve: its peer's or the general pool's connections were
    /// all busy.
    ToReserve,
    /// Closed at once: the reserve too was answering requests.
    Refused,
}

impl Shed {
    /// The metric's label.
    pub fn label(self) -> &'static str {
        match self {
            Shed::EvictedIdle => "evicted_idle",
            Shed::EvictedReserve => "evicted_reserve",
            Shed::ToReserve => "to_reserve",
            Shed::Refused => "refused",
        }
    }
}

/// The sizes of the pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    /// Connections served as always.
    pub general: usize,
    /// General connections one peer may hold.
    pub per_peer: usize,
    /// Health-check connections beyond the general pool.
    pub reserve: usize,
}

impl Sizes {
    /// The pools of a control budget of `total` connections.
    pub fn from_total(total: usize) -> Self {
        let total = total.max(16);
        let reserve = (total / 8).max(8);
        let general = total.saturating_sub(reserve).max(8);
        Sizes {
            general,
            per_peer: (general / 4).max(16).min(general),
            reserve,
        }
    }
}

/// The limits of a connection in `pool`, given the configured ones.
pub fn limits(pool: Pool, configured: ConnLimits) -> ConnLimits {
    match pool {
        Pool::General => ConnLimits {
            header: configured.header.min(HEADER),
            idle: configured.idle.min(IDLE),
            ..configured
        },
        Pool::Reserve => ConnLimits {
            header: RESERVE_LIMIT,
            idle: RESERVE_LIMIT,
            body: RESERVE_LIMIT,
            ..configured
        },
    }
}

/// The address a peer's connections are counted under: itself for IPv4
/// (an IPv4-mapped IPv6 address as IPv4), its /64 for IPv6, the block one
/// host is usually given.
pub fn peer_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

/// One open connection as the pools see it.
#[derive(Debug)]
struct Open {
    peer: IpAddr,
    /// A request is being answered (its response not yet finished).
    busy: Arc<AtomicBool>,
    /// Dropping or sending closes the connection.
    close: Option<oneshot::Sender<()>>,
}

impl Open {
    fn close(&mut self) {
        if let Some(tx) = self.close.take() {
            let _ = tx.send(());
        }
    }
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    /// By admission order: the oldest first.
    general: BTreeMap<u64, Open>,
    reserve: BTreeMap<u64, Open>,
    peers: HashMap<IpAddr, usize>,
}

/// The control listener's connections (see the [module docs](self)).
#[derive(Debug)]
pub struct ControlConns {
    sizes: Sizes,
    state: Mutex<State>,
}

/// A connection's place in a pool; dropping it gives the place back.
#[derive(Debug)]
pub struct Ticket {
    conns: Arc<ControlConns>,
    id: u64,
    /// The pool it was admitted to.
    pub pool: Pool,
    /// Set while a request is answered ([`BusyGuard`]).
    pub busy: Arc<AtomicBool>,
    /// Resolves when the pools close this connection to make room.
    pub closed: oneshot::Receiver<()>,
}

/// What admitting one connection did.
#[derive(Debug)]
pub struct Admitted {
    /// The connection's place, or `None` when it must be closed at once.
    pub ticket: Option<Ticket>,
    /// What was shed to admit it (or it), for the log and the metric;
    /// with the peer whose connection it was.
    pub shed: Vec<(Shed, IpAddr)>,
}

impl ControlConns {
    /// Pools of `sizes`.
    pub fn new(sizes: Sizes) -> Arc<Self> {
        Arc::new(ControlConns {
            sizes,
            state: Mutex::new(State::default()),
        })
    }

    /// The pools' sizes.
    pub fn sizes(&self) -> Sizes {
        self.sizes
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Connections open now in the general pool and the reserve.
    pub fn open(&self) -> (usize, usize) {
        let s = self.lock();
        (s.general.len(), s.reserve.len())
    }

    /// Admit a connection from `peer` (see the [module docs](self)).
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Admitted {
        let key = peer_key(peer);
        let mut shed = Vec::new();
        let mut s = self.lock();
        let at_cap = s.peers.get(&key).copied().unwrap_or(0) >= self.sizes.per_peer;
        let full = s.general.len() >= self.sizes.general;
        let mut pool = Pool::General;
        if at_cap || full {
            // The oldest connection with nothing in flight: the peer's own
            // when it is at its cap, anyone's when the pool is full.
            let victim = s
                .general
                .iter()
                .find(|(_, o)| !o.busy.load(Ordering::Acquire) && (!at_cap || o.peer == key))
                .map(|(id, _)| *id);
            match victim {
                Some(id) => {
                    if let Some(mut o) = s.general.remove(&id) {
                        o.close();
                        release_peer(&mut s.peers, o.peer);
                        shed.push((Shed::EvictedIdle, o.peer));
                    }
                }
                None => pool = Pool::Reserve,
            }
        }
        if pool == Pool::Reserve {
            shed.push((Shed::ToReserve, key));
            if s.reserve.len() >= self.sizes.reserve {
                let victim = s
                    .reserve
                    .iter()
                    .find(|(_, o)| !o.busy.load(Ordering::Acquire))
                    .map(|(id, _)| *id);
                match victim.and_then(|id| s.reserve.remove(&id)) {
                    Some(mut o) => {
                        o.close();
                        shed.push((Shed::EvictedReserve, o.peer));
                    }
                    None => {
                        shed.push((Shed::Refused, key));
                        return Admitted { ticket: None, shed };
                    }
                }
            }
        }
        let id = s.next_id;
        s.next_id += 1;
        let busy = Arc::new(AtomicBool::new(false));
        let (tx, rx) = oneshot::channel();
        let open = Open {
            peer: key,
            busy: Arc::clone(&busy),
            close: Some(tx),
        };
        match pool {
            Pool::General => {
                s.general.insert(id, open);
                *s.peers.entry(key).or_insert(0) += 1;
            }
            Pool::Reserve => {
                s.reserve.insert(id, open);
            }
        }
        drop(s);
        Admitted {
            ticket: Some(Ticket {
                conns: Arc::clone(self),
                id,
                pool,
                busy,
                closed: rx,
            }),
            shed,
        }
    }
}

fn release_peer(peers: &mut HashMap<IpAddr, usize>, peer: IpAddr) {
    if let Some(n) = peers.get_mut(&peer) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            peers.remove(&peer);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut s = self.conns.lock();
        match self.pool {
            Pool::General => {
                if let Some(o) = s.general.remove(&self.id) {
                    release_peer(&mut s.peers, o.peer);
                }
            }
            Pool::Reserve => {
                s.reserve.remove(&self.id);
            }
        }
    }
}

/// Marks its connection busy while a request is answered: set when the
/// handler starts, cleared when the response body ends or is dropped.
#[derive(Debug)]
pub struct BusyGuard(Arc<AtomicBool>);

impl BusyGuard {
    /// Mark `busy` set until the guard drops.
    pub fn new(busy: &Arc<AtomicBool>) -> Self {
        busy.store(true, Ordering::Release);
        BusyGuard(Arc::clone(busy))
    }
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn sizes_follow_the_descriptor_budget() {
        assert_eq!(
            Sizes::from_total(64),
            Sizes {
                general: 56,
                per_peer: 16,
                reserve: 8
            }
        );
        let big = Sizes::from_total(1250);
        assert_eq!((big.general, big.per_peer, big.reserve), (1094, 273, 156));
    }

    #[test]
    fn idle_connections_make_room_and_busy_ones_do_not() {
        // Issue 30 item 2: a peer at its cap closes its own oldest idle
        // connection; a full pool closes anyone's oldest idle one; with all
        // busy, the newcomer goes to the reserve, which refuses only when
        // every reserve connection is answering.
        let conns = ControlConns::new(Sizes {
            general: 4,
            per_peer: 2,
            reserve: 1,
        });
        let a = ip("10.0.0.1");
        let mut tickets: Vec<Ticket> = Vec::new();
        for _ in 0..2 {
            let admitted = conns.admit(a);
            assert!(admitted.shed.is_empty());
            tickets.push(admitted.ticket.unwrap());
        }
        // The third from `a` closes its first.
        let third = conns.admit(a);
        assert_eq!(third.shed, vec![(Shed::EvictedIdle, a)]);
        assert_eq!(third.ticket.as_ref().unwrap().pool, Pool::General);
        let mut first = tickets.remove(0);
        assert!(first.closed.try_recv().is_ok(), "the oldest was closed");
        drop(first);
        tickets.push(third.ticket.unwrap());
        assert_eq!(conns.open(), (2, 0));
        // Two more peers fill the pool; a fifth peer closes the oldest idle
        // one, `a`'s.
        let b = conns.admit(ip("10.0.0.2")).ticket.unwrap();
        let c = conns.admit(ip("10.0.0.3")).ticket.unwrap();
        let d = conns.admit(ip("10.0.0.4"));
        assert_eq!(d.shed, vec![(Shed::EvictedIdle, a)]);
        drop(tickets.remove(0));
        // Everyone busy: the next one goes to the reserve.
        let guards: Vec<BusyGuard> = [&tickets[0], &b, &c, d.ticket.as_ref().unwrap()]
            .iter()
            .map(|t| BusyGuard::new(&t.busy))
            .collect();
        let e = conns.admit(ip("10.0.0.5"));
        assert_eq!(e.ticket.as_ref().unwrap().pool, Pool::Reserve);
        // A second reserve connection closes the first while it waits for
        // its head; once that one answers, the next is refused.
        let mut e = e.ticket.unwrap();
        let f = conns.admit(ip("10.0.0.6"));
        assert!(f.shed.contains(&(Shed::EvictedReserve, ip("10.0.0.5"))));
        assert!(e.closed.try_recv().is_ok());
        drop(e);
        let f = f.ticket.unwrap();
        let _answering = BusyGuard::new(&f.busy);
        let g = conns.admit(ip("10.0.0.7"));
        assert!(g.ticket.is_none());
        assert!(g.shed.contains(&(Shed::Refused, ip("10.0.0.7"))));
        drop(guards);
        // Idle again: room is made once more.
        assert_eq!(conns.admit(ip("10.0.0.8")).shed[0].0, Shed::EvictedIdle);
    }

    #[test]
    fn ipv6_peers_count_by_their_64() {
        assert_eq!(
            peer_key(ip("2001:db8:1:2:aaaa::1")),
            peer_key(ip("2001:db8:1:2:bbbb::2"))
        );
        assert_eq!(peer_key(ip("::ffff:127.0.0.1")), ip("127.0.0.1"));
    }
}
