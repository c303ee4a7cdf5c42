/*
 * A model of idempotent-jobs' protocol (issue 26), checked with Spin: workers that claim a key in
 * the job's transaction, a broker that redelivers what was not acknowledged, keep lapse and
 * renewal, forget by claim token, prune, the redelivery read, and the outbox relay.
 *
 * See docs/model.md for what is modelled, the invariants, the mutants and how to run it
 * (`cargo test --test model` runs it, with tests/model.rs).
 *
 * The database is PostgreSQL at READ COMMITTED, the way the runtime uses it: each statement is one
 * atomic step on the committed state of one key's row; a write takes the row's lock (`lock[k]`) and
 * holds it to the end of the transaction; a write that finds the row locked waits for it and
 * then re-checks its WHERE clause on the newest committed row; a commit makes the transaction's
 * writes visible at once; a crash closes the connection and the database rolls back whatever the
 * transaction wrote. Only the lock holder writes a row, so a transaction's uncommitted version of
 * the row lives in the worker (`held`, `tok`, `recorded`, `ran`).
 *
 * Every step names, in a comment, the Rust function it models ("file.rs fn").
 *
 * Configuration (spin -D...): NW workers (2 or 3), NK keys (1 or 2), NR relays (0, 1 or 2),
 * MAXFAULT crashes and failures in all (each crash point, failed statement, failed send, give-up
 * and lost commit spends one), MAXLAPSE keep lapses, NFORGET forgets, NPRUNE prune batches,
 * MAXATT the relay's max_attempts. Mutants: MUTANT_FORGET_BY_DIGEST, MUTANT_RENEW_WITHOUT_LOCK,
 * MUTANT_READ_FIRST_STALE, MUTANT_CLAIM_OWN_TXN, MUTANT_MARK_BEFORE_SEND,
 * MUTANT_TAKE_AT_LAST_ATTEMPT.
 */

#ifndef NW
#define NW 2
#endif
#ifndef NK
#define NK 2
#endif
#ifndef NR
#define NR 1
#endif
#ifndef MAXFAULT
#define MAXFAULT 2
#endif
#ifndef MAXLAPSE
#define MAXLAPSE 1
#endif
#ifndef NFORGET
#define NFORGET 1
#endif
#ifndef NPRUNE
#define NPRUNE 1
#endif
#ifndef MAXATT
#define MAXATT 2
#endif

/* Tokens: one per delivery a worker takes (call.rs Call::claim, the context's claim_token); the
 * run's result and its outbox message id are derived from it (outbox.rs message_id). 0 = none. */
#define MAXTOK 8

/* Messages: two copies of key 0's job (the producer published twice), one of key 1's, and, after
 * the faults stop, one final delivery per key. */
#if NK == 1
#define NMSG_INIT 2
#else
#define NMSG_INIT 3
#endif
#define NMSG (NMSG_INIT + NK)

#define M_QUEUED 0
#define M_INFLIGHT 1
#define M_ACKED 2
#define M_UNPUBLISHED 3

#define OB_NONE 0
#define OB_PENDING 1
#define OB_LEASED 2
#define OB_DELIVERED 3
#define OB_PARKED 4

/* ---- the broker ---- */
byte msg_key[NMSG];
byte msg_st[NMSG];
bit msg_rd[NMSG];          /* the broker's redelivered flag */

/* ---- done_jobs: the committed row of each key ---- */
bit c_present[NK];
byte c_tok[NK];            /* claim_token */
byte c_res[NK];            /* result: the run's token; 0 = '' (claimed, unfinished) */
bit c_lapsed[NK];          /* expires_at <= now */
byte lock[NK];             /* the row's lock: 0, worker w+1, or FORGET_LOCK */

#ifdef MUTANT_READ_FIRST_STALE
/* a replica (or a session's old snapshot) that lags the primary */
bit r_present[NK];
byte r_tok[NK];
byte r_res[NK];
bit r_lapsed[NK];
#endif

/* ---- outbox: one message per committed run, id = the run's token ---- */
byte ob_st[MAXTOK];
byte ob_att[MAXTOK];       /* attempts, counted at the lease */
bit ob_avail[MAXTOK];      /* available_at <= now (its backoff has passed) */
bit ob_lapsed[MAXTOK];     /* lease_until <= now */
byte ob_owner[MAXTOK];     /* lease_owner */
byte received[MAXTOK];     /* what the receiver got, per id (saturates at 2) */

/* ---- ghosts: what the invariants talk about ---- */
bit effc[MAXTOK];          /* the run's effect (its body's writes) is committed */
byte window[NK];           /* the run whose committed effect holds the key's keep window; 0: none */
byte next_tok;
byte faults;
byte lapses;
bit faults_off;

#define CAN_FAULT (!faults_off && faults < MAXFAULT)

/* ------------------------------------------------------------------------------------------ */
/* Workers                                                                                      */
/* ------------------------------------------------------------------------------------------ */

#define ME (w + 1)

#define PICK(i) :: msg_st[i] == M_QUEUED -> m = i

inline reset_locals() {
  m = 0; k = 0; tok = 0; turn = 0; held = 0; ran = 0; recorded = 0
}

/* The transaction rolls back: its uncommitted row version and the row's lock go. */
inline rollback() {
  if
  :: held -> lock[k] = 0; held = 0
  :: else -> skip
  fi
}

/* The worker's process dies between two steps: its connection closes and the database rolls back
 * the open transaction; the delivery was not acknowledged, so the broker redelivers it, flagged. */
inline crash() {
  printf("w%d crashes (token %d, holding the lock: %d)\n", w, tok, held);
  faults++;
  rollback();
  msg_st[m] = M_QUEUED; msg_rd[m] = 1;
  reset_locals();
  goto end_idle
}

/* An error that says nothing of the job was committed (error.rs Error::Database, InProgress, the
 * body's own error): the transaction rolled back (lifecycle.rs JobEnd::end_unfinished,
 * JobEnd::fail_after_body, attempt_claim's rollback); the consumer nacks it with requeue. */
inline nothing_committed() {
  printf("w%d fails, nothing committed (token %d)\n", w, tok);
  faults++;
  rollback();
  /* INVARIANT: an error that says nothing was committed: no effect, no row, no outbox message */
  assert(tok == 0 || (!effc[tok] && !(c_present[k] && c_tok[k] == tok) && ob_st[tok] == OB_NONE));
  msg_st[m] = M_QUEUED; msg_rd[m] = 1;
  reset_locals();
  goto end_idle
}

/* The key's lock is now this run's: its token (the call's claim token, call.rs Call::claim). */
inline got_lock() {
  lock[k] = ME; held = 1;
  if
  :: tok == 0 -> next_tok++; tok = next_tok; assert(tok < MAXTOK)
  :: else -> skip
  fi;
  printf("w%d claims key %d, token %d\n", w, k, tok)
}

/* The commit of the job's transaction: the row (claimed, with its result), the body's effect and
 * its outbox message become visible together; the lock goes. */
inline commit_job() {
#ifdef MUTANT_CLAIM_OWN_TXN
  /* db/mod.rs record (Record) ran on whichever row holds the key */
  if
  :: c_present[k] -> c_res[k] = tok
  :: else -> skip
  fi;
#else
  c_present[k] = 1; c_tok[k] = tok; c_lapsed[k] = 0;
  if
  :: recorded -> c_res[k] = tok
  :: else -> c_res[k] = 0
  fi;
#endif
  /* INVARIANT: one committed effect per key per keep window */
  assert(window[k] == 0);
  window[k] = tok; effc[tok] = 1;
  printf("w%d commits key %d, token %d: effect and outbox message %d\n", w, k, tok, tok);
  /* outbox.rs push_on -> db/mod.rs push: the body's message commits with the job */
  ob_st[tok] = OB_PENDING; ob_avail[tok] = 1;
  lock[k] = 0; held = 0
}

/* Under the key's lock, nothing of these steps is visible to any other transaction, so they run
 * in the same atomic step as the claim (a sound reduction: other steps commute with them); a crash
 * or a failure may still end the run between any two of them. The lock stays held until the commit
 * step, a separate one, so every interleaving with a run that holds the key is still explored. */
inline body_and_record() {
#ifdef MUTANT_CLAIM_OWN_TXN
  /* MUTANT: the claim commits in a transaction of its own (unfinished, result ''); the body runs in
   * a second one */
  c_present[k] = 1; c_tok[k] = tok; c_res[k] = 0; c_lapsed[k] = 0; lock[k] = 0; held = 0;
  goto own_txn_body
#else
  /* crash point: after the claim */
  if
  :: CAN_FAULT -> crash()
  :: skip
  fi;
  /* lifecycle.rs produce: the body runs in the transaction (its writes, outbox.rs push_on); or it
   * returns Err */
  if
  :: CAN_FAULT -> nothing_committed()
  :: ran = 1
  fi;
  /* crash point: after the body */
  if
  :: CAN_FAULT -> crash()
  :: skip
  fi;
  /* lifecycle.rs JobEnd::record_and_commit -> lifecycle.rs record -> db/mod.rs record (Record):
   * result, done_at, expires_at; or it fails */
  if
  :: CAN_FAULT -> nothing_committed()
  :: recorded = 1
  fi;
  goto commit_step
#endif
}

/* INVARIANT: a replay returns the first run's result: that of the run whose committed row holds
 * the key now, whose effect is committed (what a claim would replay at this instant). */
#define ASSERT_REPLAY(v) printf("w%d replays key %d: result %d\n", w, k, v); assert(c_present[k] && !c_lapsed[k] && c_tok[k] == (v) && c_res[k] == (v) && effc[v])

proctype Worker(byte w) {
  byte m, k, tok, turn;
  bit held, ran, recorded;

end_idle:
  /* The consumer takes a delivery (examples/rabbitmq_worker.rs) and tells the call whether the
   * broker redelivered it (redelivery.rs redelivered). Handing it over writes nothing to the
   * database, so it shares an atomic step with the call's first statement. */
  atomic {
    if
    PICK(0)
    PICK(1)
    PICK(2)
#if NMSG > 3
    PICK(3)
#endif
#if NMSG > 4
    PICK(4)
#endif
    fi;
    msg_st[m] = M_INFLIGHT;
    k = msg_key[m];
    printf("w%d takes m%d (key %d, redelivered %d)\n", w, m, k, msg_rd[m]);
    /* lifecycle.rs steps: a redelivery reads first (lifecycle.rs replay_before_claim ->
     * db/mod.rs done_row, DoneRead): a committed, live, finished row replays with no transaction
     * and no lock; anything else goes on to the claim. */
    if
    :: msg_rd[m] ->
#ifdef MUTANT_READ_FIRST_STALE
         /* MUTANT: the read sees a replica behind the primary (no read_guard, no causal read) */
         if
         :: r_present[k] && !r_lapsed[k] && r_res[k] != 0 -> ASSERT_REPLAY(r_res[k]); goto replayed
         :: else -> skip
         fi
#else
         if
         :: c_present[k] && !c_lapsed[k] && c_res[k] != 0 -> ASSERT_REPLAY(c_res[k]); goto replayed
         :: else -> skip
         fi
#endif
    :: else -> skip
    fi
  }

claim_turn:
  /* lifecycle.rs begin_and_claim -> attempt_claim -> transaction.rs Transaction::begin_job: BEGIN
   * (it locks nothing, so it shares the step with the first statement; a crash point before it);
   * lifecycle.rs claim_key: each turn claims, finds a live row, or goes round; after three turns
   * a serialization failure, retried from BEGIN by begin_and_claim.
   * db/postgres.rs claim, ClaimInsert: INSERT ... ON CONFLICT DO NOTHING waits for a transaction
   * that holds the key's row; or the in-progress bound (lifecycle.rs bounded_claim_key) gives up
   * first: lifecycle.rs in_progress. */
  if
  :: atomic { CAN_FAULT -> crash() }
  :: atomic { CAN_FAULT && lock[k] != 0 -> nothing_committed() }
  :: atomic {
       lock[k] == 0 ->
       if
       :: turn == 3 -> turn = 1                       /* rolled back, again from BEGIN */
       :: else -> turn++
       fi;
       if
       :: !c_present[k] -> got_lock(); body_and_record()        /* Inserted */
       :: else -> skip                                          /* conflict: nothing inserted */
       fi
     }
  fi;
  /* db/postgres.rs claim -> db/mod.rs done_row: the row that holds the key, a fresh snapshot */
  atomic {
    if
    :: !c_present[k] -> goto claim_turn                             /* Missing: pruned */
    :: c_present[k] && !c_lapsed[k] && c_res[k] != 0 ->
         ASSERT_REPLAY(c_res[k]); goto replay_in_claim              /* Found, live */
    :: else -> skip                                                 /* lapsed or unfinished */
    fi
  }
  /* db/mod.rs renew (Renew): UPDATE ... WHERE key_digest = ? AND (expires_at <= now OR
   * result = ''), which waits for the row's lock and re-checks its WHERE on the newest row */
  if
  :: atomic { CAN_FAULT && lock[k] != 0 -> nothing_committed() }
  :: atomic {
       lock[k] == 0 ->
#ifdef MUTANT_RENEW_WITHOUT_LOCK
       /* MUTANT: decided on the row read above, without the lock (SELECT, then UPDATE by digest) */
       if
       :: c_present[k] -> got_lock(); body_and_record()
       :: else -> goto claim_turn
       fi
#else
       if
       :: c_present[k] && (c_lapsed[k] || c_res[k] == 0) -> got_lock(); body_and_record()
       :: else -> goto claim_turn                                   /* renewed by another, pruned */
       fi
#endif
     }
  fi;

replay_in_claim:
  /* lifecycle.rs steps, Produced::Replayed: transaction.rs finish_job commits a transaction that
   * wrote nothing, then Outcome::Replayed and the ack, or a crash before the ack */
  atomic {
    if
    :: CAN_FAULT -> crash()
    :: skip
    fi;
    goto replayed
  }

#ifdef MUTANT_CLAIM_OWN_TXN
own_txn_body:
  /* the body's transaction: the body, then record (which waits for the row's lock) */
  if
  :: atomic { CAN_FAULT -> crash() }
  :: atomic { lock[k] == 0 -> lock[k] = ME; held = 1; ran = 1; recorded = 1 }
  fi;
#endif

commit_step:
  /* transaction.rs finish_job: the commit. It fails before committing (lifecycle.rs finish_failed,
   * Finish::BeforeCommit: nothing committed), or the connection is lost while committing (call.rs
   * Call::database: CommitOutcomeUnknown, nacked for a retry), or the worker crashes before it, or
   * it commits: Outcome::Ran, then the ack, or a crash between the commit and the ack. */
  atomic {
    if
    :: CAN_FAULT -> crash()
    :: CAN_FAULT -> nothing_committed()
    :: CAN_FAULT ->
         faults++;
         if
         :: skip; commit_job()       /* it committed */
         :: skip; rollback()         /* it did not */
         fi;
         msg_st[m] = M_QUEUED; msg_rd[m] = 1; reset_locals();
         goto end_idle
    :: commit_job();
       /* INVARIANT: Outcome::Ran means the effect is committed */
       assert(effc[tok] && !held);
       if
       :: CAN_FAULT -> crash()
       :: skip
       fi;
       goto ack
    fi
  }

replayed:
ack:
  /* the consumer acknowledges (examples/rabbitmq_worker.rs: ack after Ok) */
  atomic { printf("w%d acks m%d\n", w, m); msg_st[m] = M_ACKED; reset_locals(); goto end_idle }
}

/* ------------------------------------------------------------------------------------------ */
/* Outbox relay                                                                                 */
/* ------------------------------------------------------------------------------------------ */

#define LEASABLE(t) ((ob_st[t] == OB_PENDING && ob_avail[t]) || (ob_st[t] == OB_LEASED && ob_lapsed[t]))
#define ANY_LEASABLE (LEASABLE(1) || LEASABLE(2) || LEASABLE(3) || LEASABLE(4) || LEASABLE(5) || \
  LEASABLE(6) || LEASABLE(7))

/* INVARIANT: a message is parked only when its attempts are spent */
inline park(t) {
  printf("message %d parked after %d attempts\n", t, ob_att[t]);
  assert(ob_att[t] >= MAXATT);
  ob_st[t] = OB_PARKED; ob_owner[t] = 0; ob_lapsed[t] = 0
}

inline relay_crash_point() {
  if
  :: CAN_FAULT -> faults++; printf("relay %d crashes\n", r); goto relay_crashed
  :: skip
  fi
}

/* outbox.rs attempt: the delivery function, outside any transaction; it may fail */
inline deliver(t) {
  if
  :: CAN_FAULT -> faults++; sent = 0; printf("relay %d: sending message %d fails\n", r, t)
  :: skip ->
       /* INVARIANT: only committed messages are ever sent */
       assert(effc[t]);
       printf("relay %d sends message %d\n", r, t);
       if
       :: received[t] < 2 -> received[t]++
       :: else -> skip
       fi;
       sent = 1
  fi
}

proctype Relay(byte r) {
  byte t, i, owner, inc;
  bit sent;
  owner = r * 8 + 1;

end_idle:
  /* outbox.rs Relay::round -> db/postgres.rs lease: ParkAbandoned (lease lapsed, attempts spent),
   * then TakeAbandoned (one whose relay died, below its last attempt), else TakePending;
   * attempts + 1, lease_owner set. The owner is the round's token: one per incarnation of the
   * relay here, whose rounds are sequential. Batches of one message. The park and the take are
   * two statements, each reading the clock: a lease can lapse between them. */
  atomic {
    ANY_LEASABLE;
    i = 1;
    do
    :: i < MAXTOK ->
         if
         :: ob_st[i] == OB_LEASED && ob_lapsed[i] && ob_att[i] >= MAXATT -> park(i)
         :: else -> skip
         fi;
         i++
    :: else -> break
    od
  }
  atomic {
    t = 0; i = 1;
    do
    :: i < MAXTOK && t == 0 ->
         if
#ifdef MUTANT_TAKE_AT_LAST_ATTEMPT
         /* MUTANT: an abandoned message is taken whatever its attempts */
         :: ob_st[i] == OB_LEASED && ob_lapsed[i] -> t = i
#else
         :: ob_st[i] == OB_LEASED && ob_lapsed[i] && ob_att[i] < MAXATT -> t = i
#endif
         :: else -> skip
         fi;
         i++
    :: else -> break
    od;
    i = 1;
    do
    :: i < MAXTOK && t == 0 ->
         if
         :: ob_st[i] == OB_PENDING && ob_avail[i] -> t = i
         :: else -> skip
         fi;
         i++
    :: else -> break
    od;
    i = 0;
    if
    :: t != 0 -> ob_st[t] = OB_LEASED; ob_owner[t] = owner; ob_lapsed[t] = 0; ob_att[t]++;
         printf("relay %d (owner %d) leases message %d, attempt %d\n", r, owner, t, ob_att[t]);
         /* INVARIANT: no message is tried more often than max_attempts */
         assert(ob_att[t] <= MAXATT)
    :: else -> goto end_idle
    fi;
#ifndef MUTANT_MARK_BEFORE_SEND
    /* The delivery function touches only the receiver, which no other step reads, so it shares
     * the lease's atomic step (a sound reduction); crash points stay before and after it, and the
     * mark is a step of its own. */
    relay_crash_point();
    deliver(t);
    relay_crash_point()
#endif
  }

#ifdef MUTANT_MARK_BEFORE_SEND
  /* MUTANT: marked delivered (in its own statement) before it is sent */
  atomic {
    relay_crash_point();
    if
    :: ob_st[t] == OB_LEASED && ob_owner[t] == owner -> ob_st[t] = OB_DELIVERED; ob_owner[t] = 0;
         printf("relay %d marks message %d delivered\n", r, t)
    :: else -> skip
    fi;
    relay_crash_point();
    deliver(t);
    t = 0; sent = 0;
    goto end_idle
  }
#endif

  /* outbox.rs Relay::settle: db/mod.rs mark_delivered (MarkDelivered) while this round still
   * holds the lease, or nobody does (WHERE delivered_at IS NULL AND (lease_owner = ? OR
   * lease_owner IS NULL): parked, or pending after another relay's failed delivery), else
   * Settled::LeaseLost; or, after a failed delivery,
   * db/mod.rs mark_failed (MarkFailed): parked when the attempts are spent (Relay::settle:
   * message.attempts() >= max_attempts), else backs off */
  atomic {
    if
    :: sent ->
         if
         :: (ob_st[t] == OB_LEASED && ob_owner[t] == owner) || ob_st[t] == OB_PARKED ||
            ob_st[t] == OB_PENDING -> ob_st[t] = OB_DELIVERED; ob_owner[t] = 0;
              printf("relay %d marks message %d delivered\n", r, t);
         printf("relay %d marks message %d delivered\n", r, t)
         :: else -> skip
         fi
    :: else ->
         if
         :: ob_st[t] == OB_LEASED && ob_owner[t] == owner ->
              if
              :: ob_att[t] >= MAXATT -> park(t)
              :: else -> ob_st[t] = OB_PENDING; ob_owner[t] = 0; ob_avail[t] = 0
              fi
         :: else -> skip
         fi
    fi;
    t = 0; sent = 0;
    goto end_idle
  }

relay_crashed:
  /* the relay's process dies holding the lease: it lapses later (the clock), and a new incarnation
   * of the relay takes leases under a new owner token */
  atomic { t = 0; sent = 0; inc++; owner = r * 8 + 1 + inc; goto end_idle }
}

/* ------------------------------------------------------------------------------------------ */
/* The database's clock, the operator's forget, the prune, the replica                          */
/* ------------------------------------------------------------------------------------------ */

#define LAPSE(x) :: c_present[x] && c_res[x] != 0 && !c_lapsed[x] -> j = x
#define LEASE_LAPSE(x) :: ob_st[x] == OB_LEASED && !ob_lapsed[x] -> ob_lapsed[x] = 1; printf("the lease of message %d lapses\n", x)
#define BACKOFF_ENDS(x) :: ob_st[x] == OB_PENDING && !ob_avail[x] -> ob_avail[x] = 1

proctype Clock() {
  byte j;
end_tick:
  do
  :: atomic {
       /* a committed row's keep lapses (expires_at <= now, db/mod.rs DoneRead's `lapsed`); its
        * keep window ends */
       !faults_off && lapses < MAXLAPSE ->
       if
       LAPSE(0)
#if NK > 1
       LAPSE(1)
#endif
       fi;
       c_lapsed[j] = 1; window[j] = 0; lapses++;
       printf("key %d lapses (token %d)\n", j, c_tok[j]);
#ifdef MUTANT_READ_FIRST_STALE
       if
       :: r_present[j] && r_tok[j] == c_tok[j] -> r_lapsed[j] = 1
       :: else -> skip
       fi;
#endif
       j = 0
     }
  :: atomic {
       /* a lease lapses (lease_until <= now), or a backoff ends (available_at <= now) */
       if
       LEASE_LAPSE(1) LEASE_LAPSE(2) LEASE_LAPSE(3) LEASE_LAPSE(4) LEASE_LAPSE(5)
       LEASE_LAPSE(6) LEASE_LAPSE(7)
       BACKOFF_ENDS(1) BACKOFF_ENDS(2) BACKOFF_ENDS(3) BACKOFF_ENDS(4) BACKOFF_ENDS(5)
       BACKOFF_ENDS(6) BACKOFF_ENDS(7)
       fi
     }
  od
}

#define FORGET_LOCK 100

proctype Forget() {
  byte k, target, n;
  do
  :: n < NFORGET ->
       n++;
#if NK > 1
       if
       :: k = 0
       :: k = 1
       fi;
#endif
       /* keys.rs forget_on, one transaction: db/mod.rs lookup_key (LookupKey) reads which run's
        * row holds the key */
end_read:
       atomic { c_present[k] -> target = c_tok[k]; printf("forget reads key %d: token %d\n", k, target) }
       /* db/mod.rs take_back (TakeBack): DELETE ... WHERE key_digest = ? AND claim_token = ?,
        * which waits for the row's lock and re-checks on the newest row; then the commit */
end_delete:
       atomic {
         lock[k] == 0 ->
#ifdef MUTANT_FORGET_BY_DIGEST
         /* MUTANT: db/mod.rs forget (Forget): by the digest alone */
         if
         :: c_present[k] ->
#else
         if
         :: c_present[k] && c_tok[k] == target ->
#endif
              /* the operator asked to forget the run `target`: its keep window ends */
              if
              :: window[k] == target -> window[k] = 0
              :: else -> skip
              fi;
              printf("forget deletes key %d (token %d)\n", k, c_tok[k]);
              c_present[k] = 0; c_tok[k] = 0; c_res[k] = 0; c_lapsed[k] = 0
         :: else -> skip
         fi;
         target = 0
       }
  :: else -> break
  od
}

#define PRUNE_ROW(x) \
  if \
  :: c_present[x] && c_lapsed[x] && lock[x] == 0 -> \
       printf("prune deletes key %d\n", x); \
       assert(window[x] == 0); \
       c_present[x] = 0; c_tok[x] = 0; c_res[x] = 0; c_lapsed[x] = 0 \
  :: else -> skip \
  fi

proctype Prune() {
  byte n;
  do
  :: n < NPRUNE ->
       /* prune.rs prune_lapsed -> Batches::run -> db/postgres.rs PruneLapsed: one batch, in a
        * transaction of its own: DELETE lapsed rows, FOR UPDATE SKIP LOCKED (a row a claim is
        * renewing is skipped) */
       atomic {
         n++;
         PRUNE_ROW(0);
#if NK > 1
         PRUNE_ROW(1);
#endif
         skip
       }
  :: else -> break
  od
}

#ifdef MUTANT_READ_FIRST_STALE
#define REPLICATE(x) r_present[x] = c_present[x]; r_tok[x] = c_tok[x]; r_res[x] = c_res[x]; r_lapsed[x] = c_lapsed[x]
proctype Replica() {
end_replay:
  do
  :: atomic {
       REPLICATE(0);
#if NK > 1
       REPLICATE(1);
#endif
       skip
     }
  od
}
#endif

/* ------------------------------------------------------------------------------------------ */
/* The run, then a final delivery of every key with the faults stopped                          */
/* ------------------------------------------------------------------------------------------ */

init {
  byte i, t;
  atomic {
    msg_key[0] = 0; msg_key[1] = 0;
#if NK > 1
    msg_key[2] = 1;
#endif
    i = 0;
    do
    :: i < NK -> msg_key[NMSG_INIT + i] = i; msg_st[NMSG_INIT + i] = M_UNPUBLISHED; i++
    :: else -> break
    od;
    i = 0;
    do
    :: i < NW -> run Worker(i); i++
    :: else -> break
    od;
    i = 0;
    do
    :: i < NR -> run Relay(i); i++
    :: else -> break
    od;
    run Clock();
    run Forget();
    run Prune();
#ifdef MUTANT_READ_FIRST_STALE
    run Replica();
#endif
    i = 0
  }

  /* everything is blocked: the faults stop, and every key is delivered once more */
  timeout;
  atomic {
    faults_off = 1;
    i = 0;
    do
    :: i < NK -> msg_st[NMSG_INIT + i] = M_QUEUED; i++
    :: else -> break
    od;
    i = 0
  }
  timeout;

  atomic {
    /* INVARIANT: no key is stuck: every message, the final ones included, was handled and
     * acknowledged, and no lock is left behind */
    i = 0;
    do
    :: i < NMSG -> assert(msg_st[i] == M_ACKED); i++
    :: else -> break
    od;
    i = 0;
    do
    :: i < NK -> assert(lock[i] == 0); i++
    :: else -> break
    od;
    /* INVARIANT: every committed outbox message was delivered at least once (exactly once
     * dedup'd by its id, which is its run's), unless parked with its attempts spent; nothing
     * uncommitted was ever sent */
    t = 1;
    do
    :: t < MAXTOK ->
         if
         :: effc[t] ->
#if NR > 0
              assert((ob_st[t] == OB_DELIVERED && received[t] > 0) ||
                     (ob_st[t] == OB_PARKED && ob_att[t] >= MAXATT))
#else
              skip
#endif
         :: else -> assert(ob_st[t] == OB_NONE && received[t] == 0)
         fi;
         t++
    :: else -> break
    od
  }
}
