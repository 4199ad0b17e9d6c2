//! GPU pressure through the proxy: a fake owner-load reader feeds the real
//! pressure loop, the engine and the reclaim loop in front of two Ollama
//! emulators on two GPUs (PRES-01..06, SCOPE-05, RECL-02, RECL-15).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use tokio::sync::watch;
use vacancy::config::{Management, OnBorrowerDisconnect, OnOwnerReturn, OwnerScope};
use vacancy::engine::{
    Engine, EngineSpec, EntryId, HeldRelease, OwnerPresence, Phase, ReclaimPolicy, ResourceSpec,
    UpstreamSpec,
};
use vacancy::gpu_pressure::{
    Baseline, OwnerLoad, PressureError, PressureParams, PressureReader, PressureTracker,
};
use vacancy::shell::loops::pressure_watch::{PressureGpu, pressure_loop};
use vacancy::shell::loops::reclaim::{ReclaimTimes, reclaim_loop};
use vacancy::shell::{Lender, Target, UpstreamRoute, VolatileStore};
use vacancy::{CapacitySample, MonotonicClock, ResourceKind};
use vacancy_adapters::{AdapterSettings, OllamaAdapter};
use vacancy_test_support::{OllamaEmulator, OllamaOptions, http_request, http_stream};

/// The owner's load as a test sets it; `Err` is a failed attribution read.
#[derive(Clone)]
struct SteadyReader(Arc<Mutex<Result<OwnerLoad, String>>>);

impl SteadyReader {
    fn set(&self, load: Result<OwnerLoad, &str>) {
        *self.0.lock().unwrap() = load.map_err(str::to_owned);
    }
}

#[async_trait]
impl PressureReader for SteadyReader {
    fn name(&self) -> &str {
        "steady"
    }
    async fn read(&self, _exclude: &[u32]) -> Result<OwnerLoad, PressureError> {
        self.0
            .lock()
            .unwrap()
            .clone()
            .map_err(|reason| PressureError::Read {
                gpu: "test".into(),
                reason,
            })
    }
}

const QUIET: OwnerLoad = OwnerLoad {
    util_pct: 5,
    memory_mib: 500,
};
const GAMING: OwnerLoad = OwnerLoad {
    util_pct: 90,
    memory_mib: 8000,
};

struct Rig {
    readers: [SteadyReader; 2],
    urls: [String; 2],
    lender: Arc<Lender>,
    _emulators: [OllamaEmulator; 2],
    _stop: watch::Sender<bool>,
}

async fn rig() -> Rig {
    let emulators = [
        OllamaEmulator::start(OllamaOptions {
            token_delay: Duration::from_millis(50),
            ..OllamaOptions::default()
        })
        .unwrap(),
        OllamaEmulator::start(OllamaOptions {
            token_delay: Duration::from_millis(50),
            ..OllamaOptions::default()
        })
        .unwrap(),
    ];
    let clock = MonotonicClock::new();
    let policy = ReclaimPolicy {
        on_owner_return: OnOwnerReturn::Cancel,
        ..ReclaimPolicy::default()
    };
    let mut a = UpstreamSpec::new("a", "gpu0", 1000);
    a.reclaim = policy;
    a.owner_scope = OwnerScope::Resource;
    let mut b = UpstreamSpec::new("b", "gpu1", 1000);
    b.reclaim = policy;
    b.owner_scope = OwnerScope::Resource;
    let mut engine = Engine::new(EngineSpec {
        lending: true,
        resources: vec![
            ResourceSpec::new("gpu0", ResourceKind::Gpu, 1000),
            ResourceSpec::new("gpu1", ResourceKind::Gpu, 1000),
        ],
        upstreams: vec![a, b],
    })
    .unwrap();
    engine.set_owner(OwnerPresence::Present);
    let ids = [
        engine.upstream_id("a").unwrap(),
        engine.upstream_id("b").unwrap(),
    ];
    let lender = Arc::new(Lender::new(
        engine,
        ["gpu0".to_owned(), "gpu1".to_owned()],
        clock,
        Arc::new(VolatileStore),
    ));
    let (stop, shutdown) = watch::channel(false);
    // Capacity: both GPUs roomy, sampled every 100 ms.
    for gpu in ["gpu0", "gpu1"] {
        let lender = Arc::clone(&lender);
        let mut shutdown = shutdown.clone();
        tokio::spawn(async move {
            loop {
                let now = lender.clock().now();
                lender.record_sample(gpu, Ok(CapacitySample::memory(40_000, 80_000, now)), now);
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(100)) => {}
                    _ = shutdown.changed() => return,
                }
            }
        });
    }
    let mut routes = Vec::new();
    let mut urls = Vec::new();
    for (i, emu) in emulators.iter().enumerate() {
        let adapter =
            OllamaAdapter::new(AdapterSettings::new(emu.base_url().parse().unwrap(), clock))
                .unwrap();
        let route = Arc::new(UpstreamRoute {
            name: ["a", "b"][i].to_owned(),
            id: ids[i],
            adapter: Arc::new(adapter),
            target: Target::parse(&emu.base_url()).unwrap(),
            management: Management::Deny,
            on_borrower_disconnect: OnBorrowerDisconnect::Drain,
            completion_timeout: Duration::from_secs(60),
            stop_proof_timeout: Duration::from_secs(4),
            max_body_bytes: 1 << 20,
            connect_timeout: Duration::from_secs(2),
            overhead_header: false,
            tunnel_idle: Duration::from_secs(3600),
            credential: None,
            reads: vacancy::shell::upstream::pool::ReadPool::new(Duration::from_secs(2)),
            series: Default::default(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        urls.push(format!(
            "http://{}/api/generate",
            listener.local_addr().unwrap()
        ));
        tokio::spawn(vacancy::shell::serve(
            listener,
            Arc::clone(&lender),
            Arc::clone(&route),
            vacancy::shell::Listening::default(),
            shutdown.clone(),
            Duration::from_secs(1),
        ));
        routes.push(route);
    }
    tokio::spawn(reclaim_loop(
        Arc::clone(&lender),
        routes,
        ReclaimTimes {
            step_every: Duration::from_millis(50),
            ..ReclaimTimes::default()
        },
        shutdown.clone(),
    ));
    let params = PressureParams {
        poll: Duration::from_millis(100),
        util_threshold_pct: 25,
        memory_threshold_mib: 1024,
        engage_after: Duration::from_millis(300),
        quiet_for: Duration::from_millis(600),
    };
    let baseline = Baseline {
        attended: Some(QUIET),
        unattended: Some(QUIET),
    };
    let readers = [
        SteadyReader(Arc::new(Mutex::new(Ok(QUIET)))),
        SteadyReader(Arc::new(Mutex::new(Ok(QUIET)))),
    ];
    let gpus = ["gpu0", "gpu1"]
        .iter()
        .zip(&readers)
        .map(|(name, reader)| PressureGpu {
            tracker: PressureTracker::new(*name, params, baseline, clock.now()),
            reader: Arc::new(reader.clone()),
        })
        .collect();
    tokio::spawn(pressure_loop(
        Arc::clone(&lender),
        gpus,
        Vec::new(),
        params.poll,
        shutdown.clone(),
    ));
    Rig {
        readers,
        urls: [urls[0].clone(), urls[1].clone()],
        lender,
        _emulators: emulators,
        _stop: stop,
    }
}

fn generate(tokens: u32) -> Vec<u8> {
    json!({"model": "llama3", "prompt": "hi", "stream": true, "options": {"num_predict": tokens}})
        .to_string()
        .into_bytes()
}

async fn admitted(url: &str, tokens: u32) -> vacancy_test_support::HttpStream {
    for _ in 0..100 {
        let s = http_stream(
            "POST",
            url,
            &[("content-type", "application/json")],
            generate(tokens),
        )
        .await
        .unwrap();
        if s.status == 200 {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("never admitted at {url}");
}

async fn outcome(mut s: vacancy_test_support::HttpStream) -> Result<(), String> {
    while let Some(chunk) = s.next_chunk().await {
        chunk.map_err(|e| e.to_string())?;
    }
    Ok(())
}

async fn wait_held(lender: &Lender) -> EntryId {
    for _ in 0..100 {
        if let Some(w) = lender.status().work.iter().find(|w| w.phase == Phase::Held) {
            return w.id.parse().unwrap();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no held entry: {:?}", lender.status().work);
}

async fn refusal_code(url: &str) -> String {
    let r = http_request(
        "POST",
        url,
        &[("content-type", "application/json")],
        generate(1),
    )
    .await
    .unwrap();
    if r.status == 200 {
        return "admitted".into();
    }
    r.json().unwrap()["error"]
        .as_str()
        .unwrap()
        .split(':')
        .next()
        .unwrap()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engaged_pressure_reclaims_only_the_work_on_its_gpu() {
    // PRES-01, PRES-02, PRES-03, SCOPE-05 (exempt upstreams, owner present),
    // SCOPE-07 (their on_owner_return applies to pressure), RECL-15
    let rig = rig().await;
    let on_gpu0 = admitted(&rig.urls[0], 400).await;
    let on_gpu1 = admitted(&rig.urls[1], 60).await;
    rig.readers[0].set(Ok(GAMING));
    let cut = tokio::time::timeout(Duration::from_secs(10), outcome(on_gpu0))
        .await
        .expect("pressure reclaims the work on gpu0");
    assert!(cut.is_err(), "cancel mode closes the response");
    // Ollama cannot prove the stop: the entry is held (DONE-04) until an
    // administrator confirms it; then pressure is what refuses.
    let held = wait_held(&rig.lender).await;
    rig.lender
        .release_held(held, HeldRelease::AdministratorConfirmed)
        .await
        .unwrap();
    assert_eq!(refusal_code(&rig.urls[0]).await, "pressure");
    // gpu1's work and lending go on.
    assert!(
        outcome(on_gpu1).await.is_ok(),
        "unrelated work is untouched"
    );
    assert_eq!(refusal_code(&rig.urls[1]).await, "admitted");
    // Quiet for the quiet time releases gpu0 again.
    rig.readers[0].set(Ok(QUIET));
    let mut code = String::new();
    for _ in 0..60 {
        code = refusal_code(&rig.urls[0]).await;
        if code != "pressure" && code != "resource_busy" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(code, "admitted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_reads_refuse_at_once_and_reclaim_only_past_the_gap_limit() {
    // PRES-04, PRES-05 (gap limit: at least 20 s)
    let rig = rig().await;
    let work = admitted(&rig.urls[0], 60).await; // ~3 s, well inside the gap limit
    rig.readers[0].set(Err("NVML: GPU is lost"));
    let mut refusing = false;
    for _ in 0..30 {
        if rig.lender.status().resources[0].pressure != "admits" {
            refusing = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(refusing, "an unavailable reading refuses new work at once");
    assert!(
        outcome(work).await.is_ok(),
        "accepted work is not reclaimed before the gap limit"
    );
    assert_eq!(refusal_code(&rig.urls[0]).await, "pressure");
    let status = rig.lender.status();
    assert!(status.reclaims.is_empty(), "{:?}", status.reclaims);
    assert!(
        status.resources[0].pressure.contains("GPU is lost"),
        "{}",
        status.resources[0].pressure
    );
}
