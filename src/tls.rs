//! The TLS provider every HTTP client of the crate (model adapters, the
//! A2A client, streamable HTTP MCP servers) builds on: reqwest is built
//! without one, so rustls's ring provider is installed before the first
//! client, once per process.

use std::sync::Once;

/// Installs rustls's ring provider unless the process has one already (an
/// embedding application may have installed its own): either way one is
/// in place afterwards.
pub(crate) fn install_crypto_provider() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
