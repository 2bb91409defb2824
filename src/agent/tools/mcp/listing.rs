//! A server's `tools/list`, bounded, and the refreshes that
//! `notifications/tools/list_changed` asks for, coalesced: what a hostile
//! server can make the client do is listed here once.
//!
//! **A listing** follows the server's cursors page by page until it has
//! [`MAX_TOOLS`] tools, [`MAX_PAGES`] pages or [`MAX_LISTING_BYTES`] of
//! tools as JSON, whichever comes first. What it gathered until then is the
//! listing, and why it stopped is kept beside it ([`Listing::cut`]): warned,
//! and told to a call of a tool it may have missed. A server paginating for
//! ever (measured: 2.7 GB within the initialize timeout before this bound)
//! costs at most that, each page being bounded by the transport already
//! (16 MiB a line or an answer).
//!
//! **Refreshes** ([`Refreshes`]): one at a time per connection; the
//! notifications that arrive while one runs ask for one more after it,
//! however many they are (100,000 of them used to start 100,000 listings:
//! 955 MB, and calls waiting behind them for over a minute).

use std::sync::Mutex;

use rmcp::model::{ListToolsResult, PaginatedRequestParams, Tool as RemoteTool};
use rmcp::service::{Peer, RoleClient};
use rmcp::ServiceError;

/// The most tools kept from one server.
pub(super) const MAX_TOOLS: usize = 256;

/// The most pages of one listing: 256 tools four to a page.
pub(super) const MAX_PAGES: usize = 64;

/// The most tools one listing keeps, as JSON: 256 tools of the largest
/// schema a tool may have (64 KiB, `catalog.rs`).
pub(super) const MAX_LISTING_BYTES: usize = 16 * 1024 * 1024;

/// One server's tools as listed.
#[derive(Debug, Default)]
pub(super) struct Listing {
    /// In the server's order.
    pub(super) tools: Vec<RemoteTool>,
    /// Why the listing stopped before the server's last page, if it did.
    pub(super) cut: Option<String>,
}

/// The tools `peer` lists, within the bounds.
pub(super) async fn list(peer: &Peer<RoleClient>) -> Result<Listing, ServiceError> {
    list_pages(|cursor| peer.list_tools(Some(PaginatedRequestParams::default().with_cursor(cursor)))).await
}

/// The tools the pages `page(cursor)` answers list, within the bounds.
async fn list_pages<Page>(mut page: impl FnMut(Option<String>) -> Page) -> Result<Listing, ServiceError>
where
    Page: std::future::Future<Output = Result<ListToolsResult, ServiceError>>,
{
    let mut listing = Listing::default();
    let (mut pages, mut bytes) = (0, 0);
    let mut cursor = None;
    loop {
        let answer = page(cursor.take()).await?;
        pages += 1;
        for tool in answer.tools {
            if listing.tools.len() == MAX_TOOLS {
                return Ok(listing.cut_at(format!("it lists more than {MAX_TOOLS} tools")));
            }
            bytes += json_len(&tool);
            if bytes > MAX_LISTING_BYTES {
                return Ok(listing.cut_at(format!("its tools are over {MAX_LISTING_BYTES} bytes of JSON")));
            }
            listing.tools.push(tool);
        }
        match answer.next_cursor {
            None => return Ok(listing),
            Some(_) if pages == MAX_PAGES => {
                return Ok(listing.cut_at(format!("its tools/list goes on past {MAX_PAGES} pages")));
            }
            Some(next) => cursor = Some(next),
        }
    }
}

impl Listing {
    fn cut_at(mut self, why: String) -> Listing {
        self.cut = Some(format!("{why}; the first {} are kept", self.tools.len()));
        self
    }
}

/// The length of `value` as JSON, without building the text.
pub(super) fn json_len(value: &impl serde::Serialize) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    // Writing to a counter cannot fail, and a value that cannot be
    // written is as long as what was written of it.
    let _ = serde_json::to_writer(&mut counter, value);
    counter.0
}

/// Where one connection's refreshes stand.
#[derive(Debug, Default)]
enum Refresh {
    #[default]
    Idle,
    Running,
    /// Running, and asked for again meanwhile.
    Again,
}

/// One connection's refreshes, coalesced: see the module doc.
#[derive(Debug, Default)]
pub(super) struct Refreshes {
    state: Mutex<Refresh>,
}

impl Refreshes {
    /// A notification came: whether its receiver starts a refresh (none
    /// runs); otherwise the running one goes once more when it ends.
    pub(super) fn ask(&self) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match *state {
            Refresh::Idle => {
                *state = Refresh::Running;
                true
            }
            Refresh::Running | Refresh::Again => {
                *state = Refresh::Again;
                false
            }
        }
    }

    /// A refresh ended: whether it goes once more.
    pub(super) fn again(&self) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match *state {
            Refresh::Again => {
                *state = Refresh::Running;
                true
            }
            Refresh::Idle | Refresh::Running => {
                *state = Refresh::Idle;
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn tool(name: String, description: String) -> RemoteTool {
        RemoteTool::new(name, description, Arc::new(serde_json::Map::new()))
    }

    /// Pages of `per_page` tools named by their number, each with `description`, for ever.
    async fn endless(per_page: usize, description: &str) -> (Listing, usize) {
        let mut asked = 0;
        let listing = list_pages(|cursor| {
            asked += 1;
            let page: usize = cursor.map_or(0, |cursor| cursor.parse().unwrap());
            let tools = (0..per_page).map(|n| tool(format!("t{}", page * per_page + n), description.to_owned()));
            let mut answer = ListToolsResult::with_all_items(tools.collect());
            answer.next_cursor = Some((page + 1).to_string());
            std::future::ready(Ok(answer))
        });
        let listing = listing.await.unwrap();
        (listing, asked)
    }

    #[tokio::test]
    async fn a_listing_that_never_ends_stops_at_the_page_bound() {
        let (listing, asked) = endless(0, "").await;
        assert_eq!(asked, MAX_PAGES);
        assert!(listing.tools.is_empty());
        assert_eq!(listing.cut.unwrap(), "its tools/list goes on past 64 pages; the first 0 are kept");
    }

    #[tokio::test]
    async fn a_listing_stops_at_the_tool_bound_and_keeps_the_first_tools() {
        let (listing, asked) = endless(100, "").await;
        assert_eq!(asked, 3);
        assert_eq!(listing.tools.len(), MAX_TOOLS);
        assert_eq!(listing.tools[0].name, "t0");
        assert!(listing.cut.unwrap().starts_with("it lists more than 256 tools"));
    }

    #[tokio::test]
    async fn a_listing_stops_at_the_byte_bound() {
        let (listing, _) = endless(1, &"d".repeat(1024 * 1024)).await;
        assert_eq!(listing.tools.len(), MAX_LISTING_BYTES / (1024 * 1024) - 1);
        assert!(listing.cut.unwrap().starts_with("its tools are over 16777216 bytes of JSON"));
    }

    #[tokio::test]
    async fn a_listing_without_a_cursor_is_whole() {
        let page = || std::future::ready(Ok(ListToolsResult::with_all_items(vec![tool("a".into(), String::new())])));
        let listing = list_pages(|_| page()).await.unwrap();
        assert_eq!((listing.tools.len(), listing.cut), (1, None));
    }

    #[test]
    fn refreshes_asked_while_one_runs_make_one_more_after_it() {
        let refreshes = Refreshes::default();
        assert!(refreshes.ask(), "the first notification starts a refresh");
        assert!((0..100_000).all(|_| !refreshes.ask()), "later ones start none");
        assert!(refreshes.again(), "they ask for one more after it");
        assert!(!refreshes.again(), "and only one");
        assert!(refreshes.ask(), "idle again: the next notification starts one");
    }

    #[test]
    fn json_len_is_the_length_of_the_text() {
        let value = serde_json::json!({"a": [1, "é", null]});
        assert_eq!(json_len(&value), value.to_string().len());
    }
}
