//! Streamable HTTP: the SDK's client transport on the crate's own reqwest
//! (rustls, no redirects followed — a header may carry a token), with the
//! SDK's bounds on each answer (16 MiB of JSON, 16 MiB per event). A
//! server that forgot the session (restarted, say) answers 404, and the
//! transport starts a new one and sends the request again; a broken event
//! stream is resumed a few times, then its calls fail.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};
use rmcp::transport::common::client_side_sse::ExponentialBackoff;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;

use super::McpStartError;

/// How long a TCP (and TLS) connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A broken event stream is resumed at most three times, 0.2, 0.4 and
/// 0.8 s after it broke: a server that is gone fails the calls waiting
/// on it within seconds (the SDK's default retries forever).
fn reconnect() -> ExponentialBackoff {
    let mut backoff = ExponentialBackoff::default();
    backoff.max_times = Some(3);
    backoff.base_duration = Duration::from_millis(200);
    backoff.max_delay = Some(Duration::from_secs(2));
    backoff
}

/// The transport to `url`, each request with `headers`.
pub(super) fn transport(
    url: &str,
    headers: &[(String, String)],
) -> Result<StreamableHttpClientTransport<reqwest::Client>, McpStartError> {
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(McpStartError::Endpoint(format!("{url:?} is not an http:// or https:// URL")));
    }
    let mut custom = HashMap::with_capacity(headers.len());
    for (name, value) in headers {
        if let Some(problem) = crate::agent::mcp_header_problem(name, value) {
            return Err(McpStartError::Endpoint(problem));
        }
        let invalid = || McpStartError::Endpoint(format!("header {name:?} is not a valid HTTP header"));
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| invalid())?;
        let mut value = HeaderValue::from_str(value).map_err(|_| invalid())?;
        value.set_sensitive(true);
        custom.insert(name, value);
    }
    crate::tls::install_crypto_provider();
    let client = reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|error| McpStartError::Endpoint(format!("the HTTP client: {error}")))?;
    let mut config =
        StreamableHttpClientTransportConfig::with_uri(url).custom_headers(custom).reinit_on_expired_session(true);
    config.retry_config = Arc::new(reconnect());
    Ok(StreamableHttpClientTransport::with_client(client, config))
}
