//! Metadata-only lists in pages (issue 19): where only names, UIDs, labels
//! and times are needed (orphan GC), the API server sends object metadata
//! only, 500 objects a response, so neither side holds a whole fleet of
//! full objects in one body.

use kube::api::{ListParams, PartialObjectMeta};
use kube::Api;
use serde::de::DeserializeOwned;
use std::fmt::Debug;

/// Objects per page: the API server's own default page for watch lists.
pub const PAGE_SIZE: u32 = 500;

/// The parameters of the page after `token` (the first page without one),
/// keeping `base`'s selectors.
pub fn page(base: &ListParams, token: Option<&str>) -> ListParams {
    let lp = base.clone().limit(PAGE_SIZE);
    match token {
        Some(t) if !t.is_empty() => lp.continue_token(t),
        _ => ListParams {
            continue_token: None,
            ..lp
        },
    }
}

/// Every object's metadata `base` selects, page after page. An expired
/// continue token (the list took longer than etcd keeps its snapshot) is
/// an error: the caller retries the whole list later.
pub async fn list_metadata<K>(
    api: &Api<K>,
    base: &ListParams,
) -> Result<Vec<PartialObjectMeta<K>>, kube::Error>
where
    K: Clone + DeserializeOwned + Debug,
{
    let mut items = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let list = api.list_metadata(&page(base, token.as_deref())).await?;
        items.extend(list.items);
        token = list.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            return Ok(items);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Case {
        name: &'static str,
        token: Option<&'static str>,
        want_continue: Option<&'static str>,
    }

    #[test]
    fn every_page_is_bounded_and_carries_the_selector_and_token() {
        let base = ListParams::default().labels("a=b");
        let cases = [
            Case {
                name: "first page",
                token: None,
                want_continue: None,
            },
            Case {
                name: "empty token is the first page",
                token: Some(""),
                want_continue: None,
            },
            Case {
                name: "next page",
                token: Some("abc"),
                want_continue: Some("abc"),
            },
        ];
        for c in cases {
            let lp = page(&base, c.token);
            assert_eq!(lp.limit, Some(PAGE_SIZE), "{}", c.name);
            assert_eq!(lp.label_selector.as_deref(), Some("a=b"), "{}", c.name);
            assert_eq!(lp.continue_token.as_deref(), c.want_continue, "{}", c.name);
        }
    }
}
