//! `async fn` handlers: generic, pooled-style deref, methods; the future is `Send`.
#![deny(warnings)]

use diesel::SqliteConnection;
use diesel_async::AsyncConnection;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use idempotent_jobs::idempotent_job;

type Conn = SyncConnectionWrapper<SqliteConnection>;

#[idempotent_job(key = "welcome:<user_id>")]
async fn welcome(conn: &mut Conn, user_id: u64) -> Result<u64, idempotent_jobs::Error> {
    let _ = conn;
    Ok(user_id)
}

#[idempotent_job(key = "generic:<id>")]
async fn generic<C: idempotent_jobs::AsyncJobStore>(conn: &mut C, id: u64) -> Result<u64, idempotent_jobs::Error> {
    let _ = conn;
    Ok(id)
}

#[idempotent_job(key = "boxed:<id>")]
async fn boxed(conn: &mut Box<Conn>, id: u64) -> Result<u64, idempotent_jobs::Error> {
    let _ = conn;
    Ok(id)
}

struct Mailer {
    region: &'static str,
}

impl Mailer {
    #[idempotent_job(key = "mail:<self.region>:<id>")]
    async fn send(&self, conn: &mut Conn, id: u64) -> Result<String, idempotent_jobs::Error> {
        let _ = conn;
        Ok(format!("{}-{id}", self.region))
    }
}

/// diesel-async's SQLite wrapper imported under another name: refused before as "a sync Diesel
/// connection" (the check read `SqliteConnection` inside it).
mod renamed {
    use diesel::SqliteConnection;
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper as Wrapped;
    use idempotent_jobs::idempotent_job;

    #[idempotent_job(key = "renamed:<id>")]
    pub async fn renamed(
        conn: &mut Wrapped<SqliteConnection>,
        id: u64,
    ) -> Result<u64, idempotent_jobs::Error> {
        let _ = conn;
        Ok(id)
    }
}

fn assert_send<T: Send>(value: T) -> T {
    value
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let mut conn = Conn::establish(":memory:").await.unwrap();
        idempotent_jobs::migrate_async(&mut conn).await.unwrap();
        assert_eq!(assert_send(welcome(&mut conn, 1)).await.unwrap(), 1);
        assert_eq!(generic(&mut conn, 2).await.unwrap(), 2);
        assert_eq!(Mailer { region: "eu" }.send(&mut conn, 3).await.unwrap(), "eu-3");
        let mut boxed_conn = Box::new(Conn::establish(":memory:").await.unwrap());
        idempotent_jobs::migrate_async(&mut *boxed_conn).await.unwrap();
        assert_eq!(boxed(&mut boxed_conn, 4).await.unwrap(), 4);
        assert_eq!(renamed::renamed(&mut conn, 5).await.unwrap(), 5);
    });
}
