//! What the monolith's SQL runs on: a pooled connection or one of its
//! transactions, whose statements are prepared once per connection and then
//! only bound and executed, or a plain `tokio_postgres` client or transaction
//! (tests, tools), which prepares each time.
//!
//! Preparing costs a round trip to PostgreSQL per query; a request that runs
//! ten queries saves ten round trips once its connection has seen them.

use std::future::Future;

use tokio_postgres::types::ToSql;
use tokio_postgres::{GenericClient, Row, Statement};

/// Statements each pooled connection keeps prepared. Beyond this (SQL built
/// with a varying number of placeholders, say) statements are prepared per
/// use, so the cache cannot grow without bound.
pub const MAX_CACHED_STATEMENTS: usize = 512;

/// What the monolith's queries run on: a pooled connection or one of its
/// transactions, whose statements are prepared once per connection and then
/// only bound and executed (one round trip to PostgreSQL instead of two), or
/// a plain `tokio_postgres` client or transaction, which prepares each time.
///
/// The methods mirror `tokio_postgres::GenericClient`'s, so query code reads
/// the same whichever it is given.
pub trait Queries: Sync {
    /// The `tokio_postgres` client underneath, for code outside the monolith
    /// (the job queue) that takes one.
    type Plain: GenericClient + Sync;

    fn plain(&self) -> &Self::Plain;

    /// The prepared statement for `sql` (prepared anew unless the
    /// connection keeps a cache).
    fn statement(
        &self,
        sql: &str,
    ) -> impl Future<Output = Result<Statement, tokio_postgres::Error>> + Send {
        async move { self.plain().prepare(sql).await }
    }

    fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<Vec<Row>, tokio_postgres::Error>> + Send {
        async move {
            let statement = self.statement(sql).await?;
            self.plain().query(&statement, params).await
        }
    }

    fn query_one(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<Row, tokio_postgres::Error>> + Send {
        async move {
            let statement = self.statement(sql).await?;
            self.plain().query_one(&statement, params).await
        }
    }

    fn query_opt(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<Option<Row>, tokio_postgres::Error>> + Send {
        async move {
            let statement = self.statement(sql).await?;
            self.plain().query_opt(&statement, params).await
        }
    }

    fn execute(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<u64, tokio_postgres::Error>> + Send {
        async move {
            let statement = self.statement(sql).await?;
            self.plain().execute(&statement, params).await
        }
    }

    /// Runs statements without parameters as one simple query.
    fn batch_execute(
        &self,
        sql: &str,
    ) -> impl Future<Output = Result<(), tokio_postgres::Error>> + Send {
        async move { self.plain().batch_execute(sql).await }
    }
}

/// `sql` from the connection's statement cache while it has room.
async fn prepare_cached(
    cache: &deadpool_postgres::StatementCache,
    client: &tokio_postgres::Client,
    sql: &str,
) -> Result<Statement, tokio_postgres::Error> {
    if cache.size() < MAX_CACHED_STATEMENTS {
        cache.prepare(client, sql).await
    } else {
        client.prepare(sql).await
    }
}

impl Queries for deadpool_postgres::ClientWrapper {
    type Plain = tokio_postgres::Client;

    fn plain(&self) -> &Self::Plain {
        self
    }

    async fn statement(&self, sql: &str) -> Result<Statement, tokio_postgres::Error> {
        prepare_cached(&self.statement_cache, self, sql).await
    }
}

impl Queries for deadpool_postgres::Client {
    type Plain = tokio_postgres::Client;

    fn plain(&self) -> &Self::Plain {
        self
    }

    fn statement(
        &self,
        sql: &str,
    ) -> impl Future<Output = Result<Statement, tokio_postgres::Error>> + Send {
        let wrapper: &deadpool_postgres::ClientWrapper = self;
        wrapper.statement(sql)
    }
}

impl<'a> Queries for deadpool_postgres::Transaction<'a> {
    type Plain = tokio_postgres::Transaction<'a>;

    fn plain(&self) -> &Self::Plain {
        self
    }

    async fn statement(&self, sql: &str) -> Result<Statement, tokio_postgres::Error> {
        prepare_cached(&self.statement_cache, self.client(), sql).await
    }
}

// A pooled connection dereferenced down to this bare client (`&**client` on
// a `deadpool_postgres::Client`) loses its statement cache without a word:
// every query is then prepared, run and closed (two round trips and a parse).
// Hand query code the pooled connection (`&client` or `&*client`).
impl Queries for tokio_postgres::Client {
    type Plain = tokio_postgres::Client;

    fn plain(&self) -> &Self::Plain {
        self
    }
}

impl<'a> Queries for tokio_postgres::Transaction<'a> {
    type Plain = tokio_postgres::Transaction<'a>;

    fn plain(&self) -> &Self::Plain {
        self
    }
}
