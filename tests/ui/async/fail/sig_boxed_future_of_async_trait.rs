//! A method as `#[async_trait]` leaves it, an `async fn` rewritten into one that returns a boxed
//! future, before `#[idempotent_job]` sees it: one error that says so and what to write. Before,
//! "`Pin<Box<dyn Future<..>>>` is not a `Result`" and "is not a database connection ... make the
//! handler an `async fn`", of a handler written as one.
use std::future::Future;
use std::pin::Pin;

use diesel::SqliteConnection;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use idempotent_jobs::idempotent_job;

struct Svc;

impl Svc {
    #[idempotent_job(key = "at:<id>")]
    fn handle<'a>(
        &'a self,
        conn: &'a mut SyncConnectionWrapper<SqliteConnection>,
        id: u64,
    ) -> Pin<Box<dyn Future<Output = Result<u64, idempotent_jobs::Error>> + Send + 'a>> {
        Box::pin(async move {
            let _ = conn;
            Ok(id)
        })
    }
}

fn main() {
    let _ = Svc;
}
