//! What a borrower is told when vacancyd answers in the upstream's place:
//! a refusal in the adapter's dialect, with the headers clients and load
//! balancers act on.

use http::header;

use crate::engine::Refusal;
use crate::shell::upstream::forward::{ProxyBody, full};
use crate::shell::upstream::route::UpstreamRoute;

/// The header the OpenAI and Anthropic SDKs read to decide whether to retry.
const SHOULD_RETRY: http::HeaderName = http::HeaderName::from_static("x-should-retry");

/// The header a load balancer matches to retry a refusal on another lender:
/// `true` only where this lender's own state refused
/// ([`RefusalCode::retry_elsewhere`](crate::engine::RefusalCode::retry_elsewhere)) and nothing of the request reached the
/// upstream (docs/fleet.md).
pub const RETRY_ELSEWHERE: http::HeaderName =
    http::HeaderName::from_static("vacancy-retry-elsewhere");

/// A refusal rendered in the adapter's dialect, for a request of which
/// nothing reached the upstream.
pub fn refusal_response(
    route: &UpstreamRoute,
    refusal: &Refusal,
    close: bool,
) -> http::Response<ProxyBody> {
    render(route, refusal, close, refusal.code.retry_elsewhere())
}

/// A refusal for a request the upstream may already have received (a reclaim
/// cut it before its reply): never marked safe to send to another lender,
/// whatever its code.
pub fn refusal_after_forwarding(
    route: &UpstreamRoute,
    refusal: &Refusal,
    close: bool,
) -> http::Response<ProxyBody> {
    render(route, refusal, close, false)
}

fn render(
    route: &UpstreamRoute,
    refusal: &Refusal,
    close: bool,
    retry_elsewhere: bool,
) -> http::Response<ProxyBody> {
    let rendered = route.adapter.render_refusal(refusal);
    let mut resp = http::Response::new(full(rendered.body));
    *resp.status_mut() = rendered.status;
    *resp.headers_mut() = rendered.headers;
    // Whatever the dialect: SDKs that honour it stop retrying what a retry
    // within seconds cannot clear (issue 14 item 9).
    resp.headers_mut().insert(
        SHOULD_RETRY,
        http::HeaderValue::from_static(if refusal.code.should_retry() {
            "true"
        } else {
            "false"
        }),
    );
    resp.headers_mut().insert(
        RETRY_ELSEWHERE,
        http::HeaderValue::from_static(if retry_elsewhere { "true" } else { "false" }),
    );
    if close {
        resp.headers_mut()
            .insert(header::CONNECTION, http::HeaderValue::from_static("close"));
    }
    resp
}
