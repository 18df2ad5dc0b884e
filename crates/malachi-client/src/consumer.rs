//! [`Consumer`]: reads a topic page by page, carrying the cursor from one fetch to the next and,
//! with a group, committing what the caller has processed.
//!
//! Commits are at-least-once: a page's cursor is committed when the caller asks for the *next*
//! page (by then it has processed the previous one) or calls [`Consumer::commit`]. A crash
//! between processing and that commit re-delivers the page; it never skips one.

use bytes::Bytes;
use malachi_wire::Record;

use crate::client::{Client, FetchOptions};
use crate::error::ClientError;

/// How a [`Consumer`] reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConsumerOptions {
    /// The consumer group whose position is read (first page) and committed.
    pub group: Option<String>,
    /// With `group`: read only the ranges the group assigns to this member. The server then
    /// reads from the group's committed positions on every fetch, so use it with `commit`.
    pub member: Option<String>,
    /// Resume from this cursor instead of the group's position or the beginning.
    pub cursor: Option<Bytes>,
    /// Read from the oldest retained record, ignoring the group's committed position (and the
    /// member); commits, if asked, still go to the group.
    pub from_start: bool,
    /// With `group`: commit each page's cursor once the caller has processed the page.
    pub commit: bool,
    /// Records per range per page (0: the server's default, 100).
    pub max: u32,
    /// Long-poll this long for new records when there are none (0: answer at once).
    pub wait_ms: u32,
}

/// A paging reader over one topic.
#[derive(Debug)]
pub struct Consumer<'a> {
    client: &'a Client,
    topic: String,
    options: ConsumerOptions,
    cursor: Option<Bytes>,
    /// The cursor after the last page returned, not yet committed.
    uncommitted: Option<Bytes>,
}

impl<'a> Consumer<'a> {
    pub fn new(client: &'a Client, topic: &str, options: ConsumerOptions) -> Consumer<'a> {
        let cursor = options.cursor.clone();
        Consumer { client, topic: topic.to_owned(), options, cursor, uncommitted: None }
    }

    /// The next page (empty when nothing is new within `wait_ms`). With `commit`, first
    /// commits the previous page.
    pub async fn next_page(&mut self) -> Result<Vec<Record>, ClientError> {
        if self.options.commit {
            self.commit().await?;
        }
        let fetch = FetchOptions {
            cursor: self.cursor.clone(),
            group: self.fetch_group(),
            member: self.fetch_member(),
            max: self.options.max,
            wait_ms: self.options.wait_ms,
        };
        let (records, next_cursor) = self.client.fetch(&self.topic, &fetch).await?;
        if !records.is_empty() {
            self.uncommitted = Some(next_cursor.clone());
        }
        self.cursor = Some(next_cursor);
        Ok(records)
    }

    /// Commits the cursor after the last page returned, if there is a group and anything new
    /// to commit.
    pub async fn commit(&mut self) -> Result<(), ClientError> {
        let (Some(group), Some(cursor)) = (&self.options.group, &self.uncommitted) else {
            return Ok(());
        };
        self.client.commit(&self.topic, group, cursor).await?;
        self.uncommitted = None;
        Ok(())
    }

    /// Changes the records per range of the next pages (a reader near a limit of its own asks
    /// for no more than it will use).
    pub fn set_max(&mut self, max: u32) {
        self.options.max = max;
    }

    /// The cursor to continue from (`None` before the first page).
    pub fn cursor(&self) -> Option<&Bytes> {
        self.cursor.as_ref()
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    fn fetch_group(&self) -> Option<String> {
        if self.options.from_start { None } else { self.options.group.clone() }
    }

    fn fetch_member(&self) -> Option<String> {
        if self.options.from_start { None } else { self.options.member.clone() }
    }
}
