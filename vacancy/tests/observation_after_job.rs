//! The observation loop after a job (issue 31): for an adapter that cannot
//! observe its upstream, the loop learned that the upstream answers by
//! connecting to it, one more connection per job on the owner's server. A
//! job whose own connection reached the upstream proves that already, and
//! once the loop knows it learns nothing else, such a job's end does not
//! wake it at all; a job whose connection failed still makes the loop check.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use vacancy::engine::ModelObservation;
use vacancy::shell::loops::observation::{HealthCell, observe_loop};
use vacancy::shell::{Lender, UpstreamRoute};
use vacancy::testkit::lone_upstream;
use vacancy::traits::{
    Adapter, InspectContext, InspectResult, Inspection, ObserveError, RouteClass, RouteMethod,
    RouteSpec, RouteTable, WorkRoute,
};

/// An adapter that cannot observe its upstream (as the OpenAI one), and
/// says each time it is asked.
struct Blind {
    routes: RouteTable,
    asked: mpsc::UnboundedSender<()>,
}

#[async_trait]
impl Adapter for Blind {
    fn name(&self) -> &str {
        "blind"
    }
    fn routes(&self) -> &RouteTable {
        &self.routes
    }
    fn inspect(&self, _: &WorkRoute, _: InspectContext<'_>, _: &[u8]) -> InspectResult {
        Ok(Inspection::default())
    }
    async fn observe(&self) -> Result<ModelObservation, ObserveError> {
        let _ = self.asked.send(());
        Err(ObserveError::Unsupported)
    }
}

/// An upstream that counts the connections it accepts: each one is said
/// on the channel once accepted, with its count and its client's address.
async fn counting_upstream() -> (
    std::net::SocketAddr,
    Arc<AtomicUsize>,
    mpsc::UnboundedReceiver<(usize, std::net::SocketAddr)>,
    tokio::task::JoinHandle<()>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = mpsc::unbounded_channel();
    let counted = Arc::clone(&count);
    let task = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, peer)) = listener.accept().await {
            open.push(stream);
            let _ = tx.send((counted.fetch_add(1, Ordering::SeqCst) + 1, peer));
        }
    });
    (addr, count, rx, task)
}

/// `event`, or a failure naming the wait when it does not come: a broken
/// skip fails the test instead of hanging it.
async fn within<T>(event: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), event)
        .await
        .expect("the awaited pass or connection never came")
}

struct Looping {
    route: Arc<UpstreamRoute>,
    lender: Arc<Lender>,
    health: Arc<HealthCell>,
    asked: mpsc::UnboundedReceiver<()>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Looping {
    /// A job's own connection to the upstream, as the proxy makes it.
    async fn job_connects(&self) -> Result<tokio::net::TcpStream, vacancy::shell::ConnectError> {
        self.route.target.connect(Duration::from_secs(2)).await
    }
}

fn start_loop(addr: std::net::SocketAddr) -> Looping {
    let routes = RouteTable::new(vec![RouteSpec::new(
        RouteMethod::Post,
        "/run",
        RouteClass::Work(WorkRoute::response_end()),
    )])
    .unwrap();
    let (asked_tx, asked) = mpsc::unbounded_channel();
    let adapter = Arc::new(Blind {
        routes,
        asked: asked_tx,
    });
    let (lender, route) = lone_upstream(
        "blind",
        adapter,
        &format!("http://{addr}"),
        vacancy::MonotonicClock::new(),
    )
    .unwrap();
    let health = Arc::new(HealthCell::default());
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(observe_loop(
        Arc::clone(&lender),
        Arc::clone(&route),
        Arc::clone(&health),
        // Only the first pass and the post-job ones run in a test.
        Duration::from_secs(3600),
        stopped,
    ));
    Looping {
        route,
        lender,
        health,
        asked,
        stop,
        task,
    }
}

#[tokio::test]
async fn the_observation_after_a_job_that_reached_the_upstream_opens_no_connection() {
    // Issue 31: a job's end woke the loop, and for an adapter that
    // cannot observe, the loop connected to learn the upstream answers,
    // one more connection per job on the owner's server.
    let (addr, count, mut accepted, _upstream) = counting_upstream().await;
    let mut l = start_loop(addr);
    // The first pass connects: nothing is known yet.
    within(l.asked.recv()).await.unwrap();
    assert_eq!(within(accepted.recv()).await.map(|a| a.0), Some(1));
    // A job's own connection reached the upstream, then the job ended.
    let job = l.job_connects().await.unwrap();
    assert_eq!(within(accepted.recv()).await.map(|a| a.0), Some(2));
    let trigger = l.lender.observe_trigger(l.route.id);
    // The pass after a job, as the loop ran it before it knew it learns
    // nothing else: the job's connection answers for the upstream.
    trigger.pull();
    within(l.asked.recv()).await.unwrap();
    // The loop knows now (the first pass ended before this one began): a
    // job whose connection reached the upstream does not wake it.
    let second_job = l.job_connects().await.unwrap();
    assert_eq!(within(accepted.recv()).await.map(|a| a.0), Some(3));
    assert!(!trigger.job_ended(), "the loop was woken for nothing");
    // Two more passes after jobs: the first learns from the second job's
    // connection; the next, with no connection since, connects.
    trigger.pull();
    within(l.asked.recv()).await.unwrap();
    trigger.pull();
    within(l.asked.recv()).await.unwrap();
    l.stop.send(true).unwrap();
    l.task.await.unwrap();
    // Every connection the loop made is accepted before this one.
    let marker = tokio::net::TcpStream::connect(addr).await.unwrap();
    let marker = marker.local_addr().unwrap();
    let mut counted = 0;
    while let Some((n, peer)) = within(accepted.recv()).await {
        counted = n;
        if peer == marker {
            break;
        }
    }
    assert_eq!(
        counted, 5,
        "the first pass, two jobs, the pass with no connection since and the marker: no more"
    );
    assert_eq!(count.load(Ordering::SeqCst), 5);
    assert_eq!(l.health.get().reachable, Some(true));
    drop((job, second_job));
}

#[tokio::test]
async fn a_job_that_could_not_connect_wakes_the_loop_and_it_checks_again() {
    // The skip must not hide an upstream that stopped answering.
    let (addr, _count, mut accepted, upstream) = counting_upstream().await;
    let mut l = start_loop(addr);
    within(l.asked.recv()).await.unwrap();
    assert_eq!(within(accepted.recv()).await.map(|a| a.0), Some(1));
    // A second pass begins only once the first (which learned only that
    // the upstream answers) has ended; the first pass's own connection
    // answers for this one.
    let trigger = l.lender.observe_trigger(l.route.id);
    trigger.pull();
    within(l.asked.recv()).await.unwrap();
    upstream.abort();
    let _ = upstream.await;
    // The listener is closed: the job's connection is refused.
    assert!(l.job_connects().await.is_err());
    assert!(
        trigger.job_ended(),
        "a failed connection must wake the loop"
    );
    within(l.asked.recv()).await.unwrap();
    // The pass after it starts only once this one has set the health.
    trigger.pull();
    within(l.asked.recv()).await.unwrap();
    assert_eq!(
        l.health.get().reachable,
        Some(false),
        "the post-job pass did not find the upstream unreachable: {:?}",
        l.health.get()
    );
    l.stop.send(true).unwrap();
    l.task.await.unwrap();
}
