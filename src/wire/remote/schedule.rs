//! A shared route's fleet-wide schedule on the broker: one record per
//! route in the KV bucket `p-limits` (key `route.<name>`, the name's bytes
//! outside `[A-Za-z0-9_-]` written `=XX`), advanced by compare-and-set on
//! its revision, as [`SharedSchedule`] asks.
//!
//! The record holds, in microseconds since the Unix epoch, the fleet's
//! next free request start, when its token debt is paid, the cool-down in
//! force, and each member's lease (a process is a member while it books
//! or holds calls in flight: each booking renews its lease for the
//! broker's lease TTL, and a member with calls in flight that books
//! nothing renews it every third of the TTL, so a process that died or
//! went idle drops out within one TTL and the others' share of
//! `max_concurrent` grows back, while a call longer than the TTL keeps
//! its holder counted), and the slots of the fleet's concurrency each
//! member holds and wants. A member admits calls only within the slots
//! the record granted it, and the record grants a slot only while the
//! slots its live members hold stay within the fleet's ceiling: two
//! members that start at once cannot both take the whole of
//! `max_concurrent`, and a member that died leaves its slots with its
//! lease. Times are wall-clock times: processes
//! on several hosts need their clocks in step (NTP) to within a fraction
//! of the spacing.
//!
//! Every operation fails fast while the connection is down (the process
//! then keeps to its own fraction), and is bounded by
//! [`OPERATION_TIMEOUT`].

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::kv;
use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};

use super::broker::{Broker, OPERATION_TIMEOUT};
use crate::agent::{Booked, Booking, FleetConcurrency, FleetSlots, SharedSchedule, Unshared, MAX_TOKEN_DEBT};

/// Compare-and-set tries before a booking gives up (the fleet's processes
/// racing for one record: each try that loses, another won).
const MAX_TRIES: u32 = 64;

/// How long a record outlives its last booking in the bucket.
const RECORD_AGE: Duration = Duration::from_secs(600);

/// The route's record.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Record {
    /// The fleet's next free request start.
    #[serde(default)]
    next: u64,
    /// When the fleet's token debt is paid.
    #[serde(default)]
    tokens: u64,
    /// No start before this.
    #[serde(default)]
    cool: u64,
    /// Member → the end of its lease.
    #[serde(default)]
    members: BTreeMap<String, u64>,
    /// The fleet's concurrency ceiling (0: not set yet).
    #[serde(default)]
    ceiling: u32,
    /// Bumped by each decrease of the ceiling.
    #[serde(default)]
    epoch: u64,
    /// Calls answered since the ceiling last changed.
    #[serde(default)]
    answered: u64,
    /// Member → the slots of the ceiling it holds and wants (a member's
    /// entry goes with its lease).
    #[serde(default)]
    slots: BTreeMap<String, Slots>,
}

/// One member's slots of the fleet's concurrency.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Slots {
    /// The most calls it may have in flight until it books again.
    held: u32,
    /// The calls it has in flight or waiting for a slot.
    wanted: u32,
}

impl Record {
    /// The fleet's concurrency, within `cap`, after `answered` more calls:
    /// one more per `ceiling` of them (additive increase).
    fn grow(&mut self, answered: u32, cap: u32) -> FleetConcurrency {
        let cap = cap.max(1);
        if self.ceiling == 0 || self.ceiling > cap {
            self.ceiling = cap;
        }
        self.answered += u64::from(answered);
        while self.ceiling < cap && self.answered >= u64::from(self.ceiling) {
            self.answered -= u64::from(self.ceiling);
            self.ceiling += 1;
        }
        if self.ceiling >= cap {
            self.answered = 0;
        }
        FleetConcurrency { ceiling: self.ceiling, epoch: self.epoch }
    }

    /// A call admitted at `epoch` met an unexplained overload with about
    /// `in_flight` of the fleet's calls in flight: halved, once per epoch
    /// (multiplicative decrease).
    fn back_off(&mut self, epoch: u64, in_flight: u32) -> FleetConcurrency {
        if epoch == self.epoch {
            let before = if self.ceiling == 0 { in_flight } else { self.ceiling.min(in_flight.max(1)) };
            self.ceiling = (before / 2).max(1);
            self.epoch += 1;
            self.answered = 0;
        }
        FleetConcurrency { ceiling: self.ceiling.max(1), epoch: self.epoch }
    }

    /// `member`'s slots now: it holds up to `holding` in flight until it
    /// hears the answer, and wants `wanted`. It is granted what it wants
    /// within its fair share of the ceiling (max-min: nobody gets more
    /// than an equal part while another wants more) and within what the
    /// other live members do not hold; the record counts it as holding the
    /// larger of the grant and `holding` until its next booking says
    /// less. Call after the leases were pruned.
    fn take_slots(&mut self, member: &str, holding: u32, wanted: u32) -> FleetSlots {
        let ceiling = self.ceiling.max(1);
        let members = &self.members;
        self.slots.retain(|name, _| members.contains_key(name));
        self.slots.remove(member);
        let others_hold: u32 = self.slots.values().fold(0, |sum, slots| sum.saturating_add(slots.held));
        let mut wants: Vec<u32> = self.slots.values().map(|slots| slots.wanted).collect();
        wants.push(wanted);
        let contended = wants.iter().fold(0u32, |sum, want| sum.saturating_add(*want)) > ceiling;
        let share = wanted.min(fair_share(ceiling, wants));
        let granted = share.min(ceiling.saturating_sub(others_hold));
        self.slots.insert(member.to_owned(), Slots { held: holding.max(granted), wanted });
        FleetSlots { granted, share, contended }
    }
}

/// The most any one of `wants` gets of `ceiling` shared max-min fairly
/// (water-filling), rounded up: the grants are held within the ceiling
/// by what the others hold, not by this level.
fn fair_share(ceiling: u32, mut wants: Vec<u32>) -> u32 {
    wants.sort_unstable();
    let mut left = ceiling;
    let mut sharing = u32::try_from(wants.len()).unwrap_or(u32::MAX).max(1);
    for want in wants {
        let level = left.div_ceil(sharing);
        if want > level {
            return level;
        }
        left -= want;
        sharing -= 1;
    }
    ceiling
}

/// One route's schedule on the broker, for one member process.
#[derive(Clone)]
pub(crate) struct BrokerSchedule {
    client: async_nats::Client,
    store: kv::Store,
    key: String,
    member: String,
    lease: Duration,
}

impl std::fmt::Debug for BrokerSchedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerSchedule").field("key", &self.key).field("member", &self.member).finish()
    }
}

/// The record's key for `route`.
pub(crate) fn route_key(route: &str) -> String {
    let mut key = String::with_capacity(route.len() + 6);
    key.push_str("route.");
    for byte in route.bytes() {
        if byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-' {
            key.push(byte as char);
        } else {
            key.push_str(&format!("={byte:02X}"));
        }
    }
    key
}

impl BrokerSchedule {
    /// Binds (or creates) the limits bucket of `broker` and serves `route`
    /// for `member`, whose lease lasts the broker's lease TTL.
    pub(crate) async fn bind(broker: &Broker, route: &str, member: &str) -> Result<BrokerSchedule, String> {
        let bucket = broker.names.limits_bucket();
        let store = match broker.jetstream.get_key_value(&bucket).await {
            Ok(store) => store,
            Err(_) => {
                let config = kv::Config {
                    bucket: bucket.clone(),
                    history: 1,
                    max_age: RECORD_AGE,
                    storage: async_nats::jetstream::stream::StorageType::File,
                    ..Default::default()
                };
                match broker.jetstream.create_key_value(config).await {
                    Ok(store) => store,
                    Err(error) => broker
                        .jetstream
                        .get_key_value(&bucket)
                        .await
                        .map_err(|_| format!("cannot create or bind the KV bucket {bucket}: {error}"))?,
                }
            }
        };
        Ok(BrokerSchedule {
            client: broker.client.clone(),
            store,
            key: route_key(route),
            member: member.to_owned(),
            lease: broker.lease_ttl,
        })
    }

    /// Reads the record, changes it with `change` (given now, in µs), and
    /// writes it back if nobody wrote in between; again if someone did.
    async fn update<T>(&self, change: impl Fn(&mut Record, u64) -> T) -> Result<T, Unshared> {
        if self.client.connection_state() != async_nats::connection::State::Connected {
            return Err(Unshared("not connected to the broker".to_owned()));
        }
        let unshared = |what: &str, error: &dyn std::fmt::Display| Unshared(format!("{what}: {error}"));
        for _ in 0..MAX_TRIES {
            let entry = tokio::time::timeout(OPERATION_TIMEOUT, self.store.entry(self.key.clone()))
                .await
                .map_err(|e| unshared("reading the schedule", &e))?
                .map_err(|e| unshared("reading the schedule", &e))?;
            let revision = entry.as_ref().map(|entry| entry.revision);
            let mut record = entry
                .filter(|entry| entry.operation == kv::Operation::Put)
                .and_then(|entry| serde_json::from_slice::<Record>(&entry.value).ok())
                .unwrap_or_default();
            let now = now_micros();
            let answer = change(&mut record, now);
            let bytes = serde_json::to_vec(&record).expect("a record encodes");
            let written = match revision {
                Some(revision) => self
                    .store
                    .update(&self.key, bytes.into(), revision)
                    .await
                    .map(drop)
                    .map_err(|e| (e.kind() == kv::UpdateErrorKind::WrongLastRevision, e.to_string())),
                None => self
                    .store
                    .create(&self.key, bytes.into())
                    .await
                    .map(drop)
                    .map_err(|e| (e.kind() == kv::CreateErrorKind::AlreadyExists, e.to_string())),
            };
            match written {
                Ok(()) => return Ok(answer),
                // Another member wrote first: read again.
                Err((true, _)) => continue,
                Err((false, error)) => return Err(unshared("writing the schedule", &error)),
            }
        }
        Err(Unshared(format!("{MAX_TRIES} writes of the schedule lost to other members in a row")))
    }
}

impl SharedSchedule for BrokerSchedule {
    fn book(&self, booking: Booking) -> BoxFuture<'_, Result<Booked, Unshared>> {
        Box::pin(async move {
            let lease = micros(self.lease);
            let spacing = micros(booking.spacing);
            let (first, members, concurrency, slots) = self
                .update(|record, now| {
                    record.members.retain(|_, until| *until > now);
                    record.members.insert(self.member.clone(), now + lease);
                    let first = now.max(record.next).max(record.tokens).max(record.cool);
                    record.next = first + spacing * u64::from(booking.requests);
                    // Whatever the members report together, the fleet is never
                    // longer in debt than the window `tpm` counts in.
                    let debt = i128::from(record.tokens.max(now)) + i128::from(booking.token_time_micros);
                    let most = i128::from(now) + i128::from(micros(MAX_TOKEN_DEBT));
                    record.tokens = u64::try_from(debt.clamp(i128::from(now), most)).unwrap_or(u64::MAX);
                    let concurrency = record.grow(booking.answered, booking.cap);
                    let slots = record.take_slots(&self.member, booking.holding, booking.wanted);
                    (first, u32::try_from(record.members.len()).unwrap_or(u32::MAX), concurrency, slots)
                })
                .await?;
            Ok(Booked {
                first: UNIX_EPOCH + Duration::from_micros(first),
                members,
                concurrency: Some(concurrency),
                slots: Some(slots),
            })
        })
    }

    fn cool_down(&self, until: SystemTime) -> BoxFuture<'_, Result<(), Unshared>> {
        Box::pin(async move {
            let until = micros(until.duration_since(UNIX_EPOCH).unwrap_or_default());
            self.update(|record, _| record.cool = record.cool.max(until)).await
        })
    }

    fn renew_every(&self) -> Option<Duration> {
        Some(super::renew_every(self.lease))
    }

    fn counts_slots(&self) -> bool {
        true
    }

    fn back_off(&self, epoch: u64, in_flight: u32) -> BoxFuture<'_, Result<Option<FleetConcurrency>, Unshared>> {
        Box::pin(async move { self.update(|record, _| Some(record.back_off(epoch, in_flight))).await })
    }
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

fn now_micros() -> u64 {
    micros(SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::{fair_share, route_key, Record};
    use crate::agent::FleetSlots;

    #[test]
    fn the_fleets_ceiling_halves_once_an_epoch_and_grows_by_one_a_ceiling_of_answered_calls() {
        let mut record = Record::default();
        assert_eq!(record.grow(0, 40).ceiling, 40, "it starts at the cap");
        // Two members refused with 30 in flight in the same epoch: halved once.
        let halved = record.back_off(0, 30);
        assert_eq!((halved.ceiling, halved.epoch), (15, 1));
        assert_eq!(record.back_off(0, 30), halved, "a refusal of the epoch before changes nothing");
        assert_eq!(record.back_off(1, 100).ceiling, 7, "a refusal of the new epoch halves again");
        // Seven answered: eight; eight more and one: nine (one left over).
        assert_eq!(record.grow(7, 40).ceiling, 8);
        assert_eq!(record.grow(9, 40).ceiling, 9);
        assert_eq!(record.grow(1_000, 40).ceiling, 40, "never past the cap");
        for epoch in 2..20 {
            record.back_off(epoch, 40);
        }
        assert_eq!(record.grow(0, 40).ceiling, 1, "never below one");
    }

    #[test]
    fn members_that_ask_at_once_are_granted_the_ceiling_between_them_and_a_lost_ones_slots_go_with_its_lease() {
        let mut record = Record::default();
        record.grow(0, 10);
        record.members.extend([("w1".to_owned(), 1), ("w2".to_owned(), 1)]);
        // Both ask for the whole ceiling before either holds anything: the
        // compare-and-set puts one first, and the two hold ten between them.
        let first = record.take_slots("w1", 0, 10);
        let second = record.take_slots("w2", 0, 10);
        assert_eq!(first, FleetSlots { granted: 10, share: 10, contended: false }, "alone, all of it");
        assert_eq!(second, FleetSlots { granted: 0, share: 5, contended: true }, "the first holds every slot");
        // A member holding more than its share keeps it counted until it
        // says it holds less: the other gets nothing more meanwhile.
        assert_eq!(record.take_slots("w1", 10, 10).granted, 5, "its share now, but it still holds ten");
        assert_eq!(record.take_slots("w2", 0, 10).granted, 0);
        assert_eq!(record.take_slots("w1", 5, 10).granted, 5, "it says it holds five");
        assert_eq!(record.take_slots("w2", 0, 10), FleetSlots { granted: 5, share: 5, contended: true });
        // Asking for less gives slots back; wanting none holds none.
        assert_eq!(record.take_slots("w1", 5, 0).granted, 0);
        assert_eq!(record.take_slots("w1", 0, 0).granted, 0);
        assert_eq!(record.take_slots("w2", 5, 10).granted, 10, "the first wants none now");
        // A member whose lease ended (pruned from `members`) holds nothing.
        record.members.remove("w2");
        assert_eq!(record.take_slots("w1", 0, 10).granted, 10);
        assert!(!record.slots.contains_key("w2"));
    }

    #[test]
    fn a_fair_share_is_water_filled() {
        assert_eq!(fair_share(10, vec![10, 10]), 5);
        assert_eq!(fair_share(10, vec![2, 10, 10]), 4);
        assert_eq!(fair_share(10, vec![10, 10, 10]), 4, "rounded up; the others' holdings bound the total");
        assert_eq!(fair_share(10, vec![1, 2]), 10, "nobody is short");
    }

    #[test]
    fn a_route_name_becomes_a_key_the_bucket_accepts() {
        assert_eq!(route_key("fast"), "route.fast");
        assert_eq!(route_key("gpt-4o_mini"), "route.gpt-4o_mini");
        assert_eq!(route_key("a.b c/é"), "route.a=2Eb=20c=2F=C3=A9");
    }
}
