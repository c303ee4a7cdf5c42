//! How each database says that its connection failed (closed, reset, killed, gone away): the
//! texts its `Database::connection_lost` matches, and [`anywhere`], which
//! [`Error::is_connection_lost`](crate::Error::is_connection_lost) asks without knowing the
//! database. A leaf module: the error type does not depend on the database modules.

use diesel::result::{DatabaseErrorKind, Error as DieselError};

/// PostgreSQL's (libpq's, tokio-postgres') texts for a failed connection.
#[cfg(any(feature = "postgres", feature = "async-postgres"))]
pub(crate) const POSTGRES: &[&str] = &[
    "server closed the connection",
    "terminating connection",
    "no connection to the server",
    "could not receive data",
    "could not send data",
    "connection closed",
    // libpq over TLS: "SSL connection has been closed unexpectedly".
    "connection has been closed",
    "Connection reset",
    "Broken pipe",
    "unexpected EOF",
    // tokio-postgres' own texts, without their cause, for a connection reset or timed out, or a
    // protocol it could not follow: diesel-async passes them on as they are.
    "error communicating with the server",
    "unexpected message from server",
    "error parsing response from server",
    // PgBouncer's own `FATAL` (SQLSTATE 08P01) to a client whose server connection it lost or
    // ended, sent just before it closes the client's socket: a failover or a killed server, its
    // `query_timeout`, `idle_transaction_timeout`, `transaction_timeout` and `query_wait_timeout`,
    // a database removed from its configuration, servers it cannot log in to.
    "server conn crashed?",
    "query timeout",
    "idle transaction timeout",
    "transaction timeout",
    "query_wait_timeout",
    "client_idle_timeout",
    "database removed",
    "server login has been failing",
    "pgbouncer cannot connect to server",
    // The server's own "terminating connection ..." (administrator command, idle timeouts,
    // conflict with recovery, shutdown), in each language of PostgreSQL 15's message catalogs: a
    // server whose `lc_messages` is one of them says it so, and diesel-async passes it on as
    // the error of the statement it ended (test `server_messages_are_known_in_every_language`).
    // de
    "Verbindung wird abgebrochen wegen Absturz eines anderen Serverprozesses",
    "Verbindung wird abgebrochen wegen unerwartetem SIGQUIT-Signal",
    "Verbindung wird abgebrochen, weil Protokollsynchronisierung verloren wurde",
    "Verbindung wird abgebrochen aufgrund von Anweisung des Administrators",
    "Verbindung wird abgebrochen wegen Konflikt mit der Wiederherstellung",
    "Verbindung wird abgebrochen wegen Zeitüberschreitung in inaktiver Transaktion",
    "Verbindung wird abgebrochen wegen Zeitüberschreitung in inaktiver Sitzung",
    "Verbindung wird abgebrochen aufgrund von Befehl für sofortiges Herunterfahren",
    "Verbindung wird abgebrochen wegen unerwartetem Ende des Postmasters",
    // es
    "terminando la conexión debido a una falla en otro proceso servidor",
    "terminando la conexión debido a una señal SIGQUIT inesperada",
    "terminando la conexión por pérdida de sincronía del protocolo",
    "terminando la conexión debido a una orden del administrador",
    "terminando la conexión debido a un conflicto con la recuperación",
    "terminando la conexión debido a que se agotó el tiempo de espera para transacciones abiertas inactivas",
    "terminando la conexión debido a que se agotó el tiempo de espera para sesiones abiertas inactivas",
    "terminando la conexión debido a una orden de apagado inmediato",
    "terminando la conexión debido al término inesperado de postmaster",
    // fr
    "arrêt de la connexion à cause de l'arrêt brutal d'un autre processus serveur",
    "arrêt des connexions suite à un signal SIGQUIT inattendu",
    "arrêt de la connexion à cause d'une perte de synchronisation du protocole",
    "arrêt des connexions suite à la demande de l'administrateur",
    "arrêt de la connexion à cause d'un conflit avec la restauration",
    "arrêt des connexions suite à l'expiration du délai d'inactivité en transaction",
    "arrêt des connexions suite à l'expiration du délai d'inactivité de la session",
    "arrêt des connexions suite à la commande d'arrêt immédiat",
    "arrêt des connexions suite à un arrêt inattendu du postmaster",
    // it
    "la connessione è stata terminata a causa del crash di un altro processo del server",
    "terminazione della connessione a causa di un segnale SIGQUIT imprevisto",
    "la connessione verrà terminata perché la sincronizzazione del protocollo è stata persa",
    "interruzione della connessione su comando dell'amministratore",
    "interruzione della connessione a causa di conflitto con il ripristino",
    "la connessione è stata terminata a causa di timeout di inattività durante una transazione",
    "terminazione della connessione a causa del timeout della sessione inattiva",
    "terminazione della connessione a causa di un comando di spegnimento immediato",
    "la connessione è stata terminata a causa di un'uscita inattesa di postmaster",
    // ja
    "他のサーバープロセスがクラッシュしたため接続を終了します",
    "予期しないSIGQUITシグナルによりコネクションを終了します",
    "プロトコルの同期が失われたためコネクションを終了します",
    "管理者コマンドにより接続を終了しています",
    "リカバリで競合が発生したため、接続を終了しています",
    "トランザクション中アイドルタイムアウトのため接続を終了します",
    "アイドルセッションタイムアウトにより接続を終了します",
    "即時シャットダウンコマンドによりコネクションを終了します",
    "予期しないpostmasterの終了のため、コネクションを終了します",
    // ka
    "მიერთება შეწყდება, რადგან პროტოკოლის სინქრონიზაცია დაიკარგა",
    "მიერთების შეწყვეტა ადმინისტრატორის ბრძანების გამო",
    "მიერთების შეწყვეტა აღდგენასთან კონფლიქტის გამო",
    "მიერთების შეწყვეტა დაუყოვნებლივი გამორთვის ბრძანების გამო",
    "მიერთების შეწყვეტა postmaster-ის მოულოდნელი გასვლის გამო",
    // ko
    "다른 서버 프로세스가 손상을 입어 현재 연결을 중지합니다",
    "예상치 못한 SIGQUIT 신호로 연결을 끝냅니다",
    "프로토콜 동기화 작업 실패로 연결을 종료합니다",
    "관리자 요청에 의해서 연결을 끝냅니다",
    "복구 작업 중 충돌로 연결을 끝냅니다",
    "idle-in-transaction 시간 초과로 연결을 끝냅니다",
    "idle-session 시간 초과로 연결을 끝냅니다",
    "immediate 종료 명령으로 연결을 끝냅니다",
    "postmaster의 예상치 못한 종료로 연결을 종료합니다",
    // ru
    "закрытие подключения из-за краха другого серверного процесса",
    "закрытие подключения из-за неожиданного сигнала SIGQUIT",
    "закрытие подключения из-за потери синхронизации протокола",
    "закрытие подключения по команде администратора",
    "закрытие подключения из-за конфликта с процессом восстановления",
    "закрытие подключения из-за тайм-аута простоя в транзакции",
    "закрытие подключения из-за тайм-аута простоя сеанса",
    "закрытие подключения вследствие получения команды для немедленного отключения",
    "закрытие подключения из-за неожиданного завершения главного процесса",
    // sv
    "avbryter anslutning på grund av en krash i en annan serverprocess",
    "stänger anslutning på grund av oväntad SIGQUIT-signal",
    "stänger anslutning då protokollsynkroniseringen tappades",
    "avslutar anslutning på grund av ett administratörskommando",
    "avslutar anslutning på grund av konflikt med återställning",
    "terminerar anslutning på grund av idle-in-transaction-timeout",
    "stänger anslutning på grund av idle-session-timeout",
    "stänger anslutning på grund av kommando för omedelbar nedstängning",
    "avslutar anslutning på grund av att postmaster stängde oväntat ner",
    // uk
    "завершення підключення через аварійне завершення роботи іншого серверного процесу",
    "завершення підключення через неочікуваний сигнал SIGQUIT",
    "завершення підключення через втрату синхронізації протоколу",
    "завершення підключення по команді адміністратора",
    "завершення підключення через конфлікт з процесом відновлення",
    "завершення підключення через тайм-аут бездіяльності в транзакції",
    "завершення підключення через тайм-аут неактивного сеансу",
    "завершення підключення через команду негайного завершення роботи",
    "завершення підключення через неочікуване закриття головного процесу",
    // zh_CN
    "由于其他服务器进程崩溃，正在终止连接",
    "由于收到意外的 SIGQUIT 信号，正在终止连接",
    "由于协议同步丢失，正在终止连接",
    "由于管理员命令，正在终止连接",
    "由于与恢复操作冲突，正在终止连接",
    "由于事务内空闲超时，正在终止连接",
    "由于空闲会话超时，正在终止连接",
    "由于立即关闭命令，正在终止连接",
    "由于意外的 postmaster 退出而终止连接",
    // zh_TW
    "正在結束連線，因為另一個伺服器行程崩潰",
    "由於收到非預期的 SIGQUIT 訊號，正在終止連線",
    "由於協定同步遺失，正在終止連線",
    "因管理員命令，正在中斷連線",
    "因與復原衝突，正在中斷連線",
    "由於交易中閒置逾時，正在終止連線",
    "由於閒置工作階段逾時，正在終止連線",
    "由於立即停止命令，正在終止連線",
    "因 postmaster 意外結束而終止連線",
];

/// MySQL's and MariaDB's (libmysqlclient's, mysql_async's) texts for a failed connection.
#[cfg(any(feature = "mysql", feature = "async-mysql"))]
pub(crate) const MYSQL: &[&str] = &[
    "Lost connection",
    "server has gone away",
    "Connection reset",
    "Broken pipe",
    "Input/output error",
    "connection closed",
    "Connection refused",
    // MariaDB 1927 (KILL), MySQL 8 4031 (wait_timeout), mysql_async's closed stream.
    "Connection was killed",
    "disconnected by the server because of inactivity",
    "Connection to the server is closed",
    // A Galera node out of the primary component (1047, in English whatever `lc_messages`): it
    // refuses every statement until it rejoins, and its open transaction cannot commit. Read as
    // a lost connection, the job is retryable (on another node) and its connection marked broken;
    // before, the record's refusal read as a body that ended its transaction (`ClaimNotTakenBack`,
    // an operator called out), a claim's as not retryable, and diesel-async's MySQL connection
    // was left inside the job's transaction, holding the key's row lock.
    "WSREP has not yet prepared node for application use",
];

/// Whether `error` (or, for a commit Diesel tried to roll back, the commit's own error) is one of
/// `phrases`, a database's ways of saying the connection failed.
#[cfg(any(
    feature = "postgres",
    feature = "async-postgres",
    feature = "mysql",
    feature = "async-mysql"
))]
pub(crate) fn connection_lost(error: &DieselError, phrases: &[&str]) -> bool {
    match error {
        DieselError::RollbackErrorOnCommit { commit_error, .. } => {
            connection_lost(commit_error, phrases)
        }
        DieselError::DatabaseError(DatabaseErrorKind::ClosedConnection, _) => true,
        DieselError::DatabaseError(_, info) => {
            let message = info.message().to_ascii_lowercase();
            phrases
                .iter()
                .any(|p| message.contains(&p.to_ascii_lowercase()))
        }
        _ => false,
    }
}

/// Whether `error` is any compiled-in database's way of saying the connection failed.
pub(crate) fn anywhere(error: &DieselError) -> bool {
    #[cfg(any(feature = "postgres", feature = "async-postgres"))]
    if connection_lost(error, POSTGRES) {
        return true;
    }
    #[cfg(any(feature = "mysql", feature = "async-mysql"))]
    if connection_lost(error, MYSQL) {
        return true;
    }
    matches!(
        error,
        DieselError::DatabaseError(DatabaseErrorKind::ClosedConnection, _)
    )
}

#[cfg(all(test, any(feature = "mysql", feature = "async-mysql")))]
mod mysql_tests {
    use super::*;

    /// A Galera node that left the primary component answers every statement with 1047; the
    /// runtime (which appends the number to the server's message) reads it as a lost connection.
    #[test]
    fn a_galera_node_out_of_the_primary_component_is_a_lost_connection() {
        let error = DieselError::DatabaseError(
            DatabaseErrorKind::Unknown,
            Box::new(
                "WSREP has not yet prepared node for application use (MySQL error 1047)".to_owned(),
            ),
        );
        assert!(connection_lost(&error, MYSQL));
        assert!(anywhere(&error));
    }
}

#[cfg(all(test, any(feature = "postgres", feature = "async-postgres")))]
mod tests {
    use super::*;

    /// diesel-async reports a tokio-postgres error without a SQLSTATE by its `Display` alone,
    /// which for a reset connection is "error communicating with the server": at a `COMMIT`, that
    /// is an unknown outcome, not "nothing was committed".
    #[test]
    fn tokio_postgres_transport_failures_are_lost_connections() {
        for text in [
            "error communicating with the server",
            "unexpected message from server",
            "error parsing response from server",
            "connection closed",
        ] {
            let error = DieselError::DatabaseError(
                DatabaseErrorKind::UnableToSendCommand,
                Box::new(text.to_owned()),
            );
            assert!(connection_lost(&error, POSTGRES), "{text}");
            assert!(anywhere(&error), "{text}");
        }
    }
}
