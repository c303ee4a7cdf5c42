//! What a relay run did: [`RelayReport`], shown as `outbox::RelayReport`. A module of its own,
//! which uses nothing of the crate's, so that [`Error`](crate::Error) can carry one.

/// What a relay run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayReport {
    /// Messages leased and handed to the delivery function (in an
    /// [`Error::RelayStopped`](crate::Error::RelayStopped), also those the stopped round gave back untried).
    pub leased: u64,
    /// Messages delivered and marked so.
    pub delivered: u64,
    /// Deliveries that failed (returned `Err` or panicked) and will be tried again.
    pub failed: u64,
    /// Messages parked after their last allowed attempt: those whose delivery by this run failed
    /// at it, and those this run found with their lease lapsed during it (their relay stopped,
    /// or outlived its lease), which every lease parks first.
    pub parked: u64,
    /// Deliveries whose lease had lapsed before they were marked, and whose outcome this relay no
    /// longer records: a successful one whose message another relay holds now or delivered (it
    /// may reach its receiver twice, which its id lets the receiver drop), or a failed one,
    /// whoever holds the message now. (A successful delivery whose message nobody holds any more
    /// is marked, and counted `delivered`.)
    pub lease_lost: u64,
}

impl RelayReport {
    /// Adds `other`'s counts to these.
    pub(crate) fn add(&mut self, other: &RelayReport) {
        self.leased += other.leased;
        self.delivered += other.delivered;
        self.failed += other.failed;
        self.parked += other.parked;
        self.lease_lost += other.lease_lost;
    }
}
