//! Seeded, reproducible fault injection on a stream of datagrams.
//!
//! Call order: [`FaultInjector::push`] for every datagram offered to the link,
//! then [`FaultInjector::pop_ready`] until it returns `None`; wake up again at
//! [`FaultInjector::next_release`]. Each call does bounded work.

use crate::rng::Rng;
use rdma_types::{Duration, Instant};
use std::collections::BinaryHeap;

/// What can go wrong on a link. Probabilities are per datagram, 0.0..=1.0.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultConfig {
    /// Seed of the decisions; the same seed and inputs give the same faults.
    pub seed: u64,
    /// Probability a datagram is dropped.
    pub loss: f64,
    /// Probability a datagram is delivered twice.
    pub duplicate: f64,
    /// Probability a datagram is held back by `reorder_delay`, letting later
    /// datagrams overtake it.
    pub reorder: f64,
    /// How long a reordered datagram is held back.
    pub reorder_delay: Duration,
    /// Probability one random bit of the datagram is flipped.
    pub corrupt: f64,
    /// Fixed one-way latency added to every datagram.
    pub latency: Duration,
    /// Link rate: datagrams queue behind each other for their serialization
    /// time (`None`: infinitely fast).
    pub bytes_per_sec: Option<u64>,
    /// Scheduled link outages: datagrams offered during one are dropped as
    /// by a down link (`None`: the link is only down when told).
    pub outages: Option<Outages>,
}

/// When a link goes down by itself, counted from the first datagram the
/// injector is offered (the tools' `link_down_ms` / `link_flap_ms` keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outages {
    /// From the first datagram to the start of the first outage.
    pub first_after: Duration,
    /// How long each outage lasts.
    pub down: Duration,
    /// From the start of one outage to the next (`None`: one outage).
    pub period: Option<Duration>,
}

impl Outages {
    /// Whether the link is down `since` the first datagram.
    pub fn is_down(&self, since: Duration) -> bool {
        let (t, first) = (since.total_micros(), self.first_after.total_micros());
        if t < first {
            return false;
        }
        let into = match self.period.map(Duration::total_micros) {
            Some(p) if p > 0 => (t - first) % p,
            _ => t - first,
        };
        into < self.down.total_micros()
    }
}

impl Default for FaultConfig {
    /// A perfect link with no latency.
    fn default() -> Self {
        FaultConfig {
            seed: 0,
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_delay: Duration::from_micros(200),
            corrupt: 0.0,
            latency: Duration::ZERO,
            bytes_per_sec: None,
            outages: None,
        }
    }
}

impl FaultConfig {
    /// A link that loses `loss` of its datagrams and is otherwise perfect.
    pub fn lossy(seed: u64, loss: f64) -> Self {
        FaultConfig {
            seed,
            loss,
            ..FaultConfig::default()
        }
    }

    /// Parses a compact spec such as `loss=0.01,dup=0.001,reorder=0.01,corrupt=0,seed=7,latency_us=50`,
    /// the form the tools accept on their command line. Link outages:
    /// `link_down_ms=N` takes the link down once for N ms, `link_flap_ms=D/P`
    /// for D ms out of every P ms; the first outage starts `link_down_at_ms`
    /// (default 1000) after the first datagram.
    ///
    /// # Errors
    /// Names the offending key or value.
    pub fn parse(spec: &str) -> Result<FaultConfig, FaultSpecError> {
        use FaultSpecError as E;
        let mut cfg = FaultConfig::default();
        let mut down_at: Option<Duration> = None;
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| E::NotKeyValue(item.to_string()))?;
            let prob = |v: &str| -> Result<f64, FaultSpecError> {
                let p: f64 = v.parse().map_err(|_| E::NotNumber {
                    key: key.to_string(),
                    got: v.to_string(),
                })?;
                if (0.0..=1.0).contains(&p) {
                    Ok(p)
                } else {
                    Err(E::NotProbability {
                        key: key.to_string(),
                        got: p,
                    })
                }
            };
            let micros = |v: &str| -> Result<Duration, FaultSpecError> {
                v.parse::<u64>()
                    .map(Duration::from_micros)
                    .map_err(|_| E::NotMicros {
                        key: key.to_string(),
                        got: v.to_string(),
                    })
            };
            match key {
                "seed" => cfg.seed = value.parse().map_err(|_| E::NotSeed(value.to_string()))?,
                "loss" => cfg.loss = prob(value)?,
                "dup" | "duplicate" => cfg.duplicate = prob(value)?,
                "reorder" => cfg.reorder = prob(value)?,
                "corrupt" => cfg.corrupt = prob(value)?,
                "reorder_us" => cfg.reorder_delay = micros(value)?,
                "latency_us" => cfg.latency = micros(value)?,
                "link_down_ms" | "link_flap_ms" | "link_down_at_ms" => {
                    let ms = |v: &str| -> Result<Duration, FaultSpecError> {
                        match v.parse::<u64>() {
                            Ok(n) if n <= 86_400_000 => Ok(Duration::from_millis(n)),
                            _ => Err(E::NotMillis {
                                key: key.to_string(),
                                got: v.to_string(),
                            }),
                        }
                    };
                    match key {
                        "link_down_at_ms" => down_at = Some(ms(value)?),
                        "link_down_ms" => {
                            let down = ms(value)?;
                            if down == Duration::ZERO {
                                return Err(E::ZeroLinkDown);
                            }
                            cfg.outages = Some(Outages {
                                first_after: Duration::ZERO,
                                down,
                                period: None,
                            });
                        }
                        _ => {
                            let (d, p) = value
                                .split_once('/')
                                .ok_or_else(|| E::FlapNotPair(value.to_string()))?;
                            let (down, period) = (ms(d)?, ms(p)?);
                            if down == Duration::ZERO || down >= period {
                                return Err(E::FlapOrder(value.to_string()));
                            }
                            cfg.outages = Some(Outages {
                                first_after: Duration::ZERO,
                                down,
                                period: Some(period),
                            });
                        }
                    }
                }
                other => return Err(E::UnknownKey(other.to_string())),
            }
        }
        match (cfg.outages.as_mut(), down_at) {
            (Some(o), at) => o.first_after = at.unwrap_or(Duration::from_secs(1)),
            (None, Some(_)) => return Err(E::DownAtAlone),
            (None, None) => {}
        }
        Ok(cfg)
    }
}

/// Why [`FaultConfig::parse`] refused a spec; each names the key or
/// value at fault and what it wants.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FaultSpecError {
    #[error("fault spec item '{0}' is not key=value")]
    NotKeyValue(String),
    #[error("fault spec: unknown key '{0}' (known: seed, loss, dup, reorder, corrupt, reorder_us, latency_us, link_down_ms, link_flap_ms, link_down_at_ms)")]
    UnknownKey(String),
    #[error("fault spec: 'seed' wants an integer, got '{0}'")]
    NotSeed(String),
    /// A probability key (loss, dup, reorder, corrupt) got no number.
    #[error("fault spec: '{key}' wants a number, got '{got}'")]
    NotNumber { key: String, got: String },
    #[error("fault spec: '{key}' must be within 0..=1, got {got}")]
    NotProbability { key: String, got: f64 },
    #[error("fault spec: '{key}' wants microseconds, got '{got}'")]
    NotMicros { key: String, got: String },
    #[error("fault spec: '{key}' wants milliseconds (at most a day), got '{got}'")]
    NotMillis { key: String, got: String },
    #[error("fault spec: 'link_down_ms' must be above 0")]
    ZeroLinkDown,
    #[error("fault spec: 'link_flap_ms' wants DOWN/PERIOD, got '{0}'")]
    FlapNotPair(String),
    #[error("fault spec: 'link_flap_ms' wants 0 < DOWN < PERIOD, got '{0}'")]
    FlapOrder(String),
    #[error("fault spec: 'link_down_at_ms' needs 'link_down_ms' or 'link_flap_ms'")]
    DownAtAlone,
}

/// What happened to one datagram offered to the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Passed through (possibly after the fixed latency).
    Delivered,
    /// Dropped by random loss.
    Lost,
    /// Dropped because the link is down.
    LinkDown,
    /// Delivered twice.
    Duplicated,
    /// Held back so later datagrams overtake it.
    Reordered,
    /// Delivered with one bit flipped.
    Corrupted,
}

/// Counters of what the injector did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Datagrams offered.
    pub offered: u64,
    /// Dropped by loss.
    pub lost: u64,
    /// Dropped while the link was down.
    pub link_down: u64,
    /// Extra copies delivered.
    pub duplicated: u64,
    /// Held back for reordering.
    pub reordered: u64,
    /// Bit-flipped.
    pub corrupted: u64,
}

/// Something a link can carry and corrupt.
pub trait Payload: Clone {
    /// Size in bits (0: cannot be corrupted).
    fn bit_len(&self) -> u64;
    /// Flips bit `bit` (< `bit_len`).
    fn flip_bit(&mut self, bit: u64);
}

impl Payload for Vec<u8> {
    fn bit_len(&self) -> u64 {
        self.len() as u64 * 8
    }

    fn flip_bit(&mut self, bit: u64) {
        self[(bit / 8) as usize] ^= 1 << (bit % 8);
    }
}

#[derive(Debug)]
struct Held<T> {
    release: Instant,
    seq: u64,
    data: T,
}

impl<T> PartialEq for Held<T> {
    fn eq(&self, other: &Self) -> bool {
        self.release == other.release && self.seq == other.seq
    }
}

impl<T> Eq for Held<T> {}

impl<T> Ord for Held<T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // BinaryHeap is a max-heap: invert to pop the earliest release first,
        // and among equal releases the one pushed first.
        other
            .release
            .cmp(&self.release)
            .then(other.seq.cmp(&self.seq))
    }
}

impl<T> PartialOrd for Held<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// A one-directional faulty link carrying `T` (bytes by default).
#[derive(Debug)]
pub struct FaultInjector<T = Vec<u8>> {
    cfg: FaultConfig,
    rng: Rng,
    up: bool,
    seq: u64,
    held: BinaryHeap<Held<T>>,
    stats: FaultStats,
    /// When the (rate-limited) link finishes sending what it has.
    busy_until: Instant,
    /// When the first datagram was offered (scheduled outages count from it).
    origin: Option<Instant>,
}

impl<T: Payload> FaultInjector<T> {
    /// A link applying `cfg`, initially up.
    pub fn new(cfg: FaultConfig) -> Self {
        FaultInjector {
            rng: Rng::new(cfg.seed),
            cfg,
            up: true,
            seq: 0,
            held: BinaryHeap::new(),
            stats: FaultStats::default(),
            busy_until: Instant::ZERO,
            origin: None,
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &FaultConfig {
        &self.cfg
    }

    /// Replaces the probabilities; the random stream continues.
    pub fn set_config(&mut self, cfg: FaultConfig) {
        self.cfg = cfg;
    }

    /// Takes the link down (everything offered is dropped, and so is
    /// everything still in flight) or brings it back up.
    pub fn set_link_up(&mut self, up: bool) {
        self.up = up;
        if !up {
            self.stats.link_down += self.held.len() as u64;
            self.held.clear();
        }
    }

    /// Whether the link is up.
    pub fn is_link_up(&self) -> bool {
        self.up
    }

    /// Counters so far.
    pub fn stats(&self) -> FaultStats {
        self.stats
    }

    /// Offers a datagram to the link at `now` and says what happened to it.
    pub fn push(&mut self, now: Instant, mut data: T) -> Verdict {
        self.stats.offered += 1;
        let origin = *self.origin.get_or_insert(now);
        let scheduled_down = self
            .cfg
            .outages
            .is_some_and(|o| o.is_down(now.saturating_since(origin)));
        if !self.up || scheduled_down {
            self.stats.link_down += 1;
            return Verdict::LinkDown;
        }
        if self.rng.chance(self.cfg.loss) {
            self.stats.lost += 1;
            return Verdict::Lost;
        }
        let mut verdict = Verdict::Delivered;
        if data.bit_len() > 0 && self.rng.chance(self.cfg.corrupt) {
            let bit = self.rng.below(data.bit_len());
            data.flip_bit(bit);
            self.stats.corrupted += 1;
            verdict = Verdict::Corrupted;
        }
        let mut release = now + self.cfg.latency;
        if let Some(rate) = self.cfg.bytes_per_sec.filter(|&r| r > 0) {
            let bytes = data.bit_len() / 8;
            let start = self.busy_until.max(now);
            self.busy_until = start + Duration::from_micros(bytes.saturating_mul(1_000_000) / rate);
            release = self.busy_until + self.cfg.latency;
        }
        if self.rng.chance(self.cfg.reorder) {
            release += self.cfg.reorder_delay;
            self.stats.reordered += 1;
            verdict = Verdict::Reordered;
        }
        if self.rng.chance(self.cfg.duplicate) {
            self.stats.duplicated += 1;
            self.hold(release, data.clone());
            verdict = Verdict::Duplicated;
        }
        self.hold(release, data);
        verdict
    }

    fn hold(&mut self, release: Instant, data: T) {
        self.seq += 1;
        self.held.push(Held {
            release,
            seq: self.seq,
            data,
        });
    }

    /// The next datagram due at or before `now`, in release order.
    pub fn pop_ready(&mut self, now: Instant) -> Option<T> {
        if self.held.peek()?.release <= now {
            self.held.pop().map(|h| h.data)
        } else {
            None
        }
    }

    /// When the next held datagram becomes due.
    pub fn next_release(&self) -> Option<Instant> {
        self.held.peek().map(|h| h.release)
    }

    /// Datagrams still in flight.
    pub fn in_flight(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(f: &mut FaultInjector<Vec<u8>>, now: Instant) -> Vec<Vec<u8>> {
        std::iter::from_fn(|| f.pop_ready(now)).collect()
    }

    #[test]
    fn perfect_link_is_fifo() {
        let mut f = FaultInjector::new(FaultConfig::default());
        for i in 0..10u8 {
            assert_eq!(f.push(Instant::ZERO, vec![i]), Verdict::Delivered);
        }
        let out = drain(&mut f, Instant::ZERO);
        assert_eq!(out, (0..10u8).map(|i| vec![i]).collect::<Vec<_>>());
    }

    #[test]
    fn same_seed_reproduces_the_same_faults() {
        let cfg = FaultConfig {
            seed: 42,
            loss: 0.1,
            duplicate: 0.05,
            reorder: 0.1,
            corrupt: 0.05,
            ..FaultConfig::default()
        };
        let run = |cfg: FaultConfig| {
            let mut f = FaultInjector::new(cfg);
            let verdicts: Vec<Verdict> = (0..500u32)
                .map(|i| f.push(Instant::ZERO, i.to_be_bytes().to_vec()))
                .collect();
            (
                verdicts,
                drain(&mut f, Instant::from_millis(1000)),
                f.stats(),
            )
        };
        let a = run(cfg.clone());
        let b = run(cfg.clone());
        assert_eq!(a, b);
        let c = run(FaultConfig { seed: 43, ..cfg });
        assert_ne!(a.0, c.0);
        let s = a.2;
        assert!(
            s.lost > 20 && s.duplicated > 5 && s.reordered > 20 && s.corrupted > 5,
            "{s:?}"
        );
        // Everything not lost arrives, duplicates twice.
        assert_eq!(a.1.len() as u64, s.offered - s.lost + s.duplicated);
    }

    #[test]
    fn reordered_datagram_is_overtaken() {
        let cfg = FaultConfig {
            reorder: 1.0,
            reorder_delay: Duration::from_micros(100),
            ..FaultConfig::default()
        };
        let mut f = FaultInjector::new(cfg);
        assert_eq!(f.push(Instant::ZERO, vec![1]), Verdict::Reordered);
        f.set_config(FaultConfig::default());
        assert_eq!(
            f.push(Instant::from_micros(10), vec![2]),
            Verdict::Delivered
        );
        assert_eq!(f.pop_ready(Instant::from_micros(10)), Some(vec![2]));
        assert_eq!(f.pop_ready(Instant::from_micros(50)), None);
        assert_eq!(f.next_release(), Some(Instant::from_micros(100)));
        assert_eq!(f.pop_ready(Instant::from_micros(100)), Some(vec![1]));
    }

    #[test]
    fn link_down_drops_offered_and_in_flight() {
        let cfg = FaultConfig {
            latency: Duration::from_micros(10),
            ..FaultConfig::default()
        };
        let mut f = FaultInjector::new(cfg);
        f.push(Instant::ZERO, vec![1]);
        f.set_link_up(false);
        assert_eq!(f.push(Instant::ZERO, vec![2]), Verdict::LinkDown);
        assert_eq!(f.pop_ready(Instant::from_micros(100)), None);
        assert_eq!(f.stats().link_down, 2);
        f.set_link_up(true);
        assert_eq!(f.push(Instant::ZERO, vec![3]), Verdict::Delivered);
        assert_eq!(f.pop_ready(Instant::from_micros(10)), Some(vec![3]));
    }

    #[test]
    fn rate_limit_serializes_datagrams() {
        let cfg = FaultConfig {
            bytes_per_sec: Some(1_000_000), // 1 byte per microsecond
            ..FaultConfig::default()
        };
        let mut f = FaultInjector::new(cfg);
        f.push(Instant::ZERO, vec![0u8; 100]);
        f.push(Instant::ZERO, vec![1u8; 50]);
        assert_eq!(f.next_release(), Some(Instant::from_micros(100)));
        assert_eq!(f.pop_ready(Instant::from_micros(99)), None);
        assert_eq!(
            f.pop_ready(Instant::from_micros(100)).map(|d| d.len()),
            Some(100)
        );
        assert_eq!(
            f.next_release(),
            Some(Instant::from_micros(150)),
            "queued behind the first"
        );
        // An idle link starts afresh.
        f.push(Instant::from_micros(1000), vec![0u8; 10]);
        assert_eq!(
            f.pop_ready(Instant::from_micros(150)).map(|d| d.len()),
            Some(50)
        );
        assert_eq!(f.next_release(), Some(Instant::from_micros(1010)));
    }

    #[test]
    fn corruption_flips_exactly_one_bit() {
        let cfg = FaultConfig {
            corrupt: 1.0,
            ..FaultConfig::default()
        };
        let mut f = FaultInjector::new(cfg);
        let orig = vec![0u8; 64];
        assert_eq!(f.push(Instant::ZERO, orig.clone()), Verdict::Corrupted);
        let got = f.pop_ready(Instant::ZERO).unwrap();
        let flipped: u32 = got
            .iter()
            .zip(&orig)
            .map(|(a, b)| (a ^ b).count_ones())
            .sum();
        assert_eq!(flipped, 1);
    }

    #[test]
    fn spec_parsing_names_bad_keys_and_values() {
        let c = FaultConfig::parse("loss=0.01,dup=0.5,seed=9,latency_us=20").unwrap();
        assert_eq!(c.loss, 0.01);
        assert_eq!(c.duplicate, 0.5);
        assert_eq!(c.seed, 9);
        assert_eq!(c.latency, Duration::from_micros(20));
        let refused = |s| FaultConfig::parse(s).unwrap_err().to_string();
        assert!(refused("loss=2").contains("0..=1"));
        assert!(refused("lose=0.1").contains("unknown key 'lose'"));
        assert!(refused("loss").contains("key=value"));
        assert!(refused("seed=x").contains("'seed'"));
    }

    #[test]
    fn link_outage_keys_parse_and_refuse_nonsense() {
        let c = FaultConfig::parse("link_down_ms=300,link_down_at_ms=50").unwrap();
        assert_eq!(
            c.outages,
            Some(Outages {
                first_after: Duration::from_millis(50),
                down: Duration::from_millis(300),
                period: None,
            })
        );
        let c = FaultConfig::parse("loss=0.01,link_flap_ms=20/100").unwrap();
        assert_eq!(
            c.outages,
            Some(Outages {
                first_after: Duration::from_secs(1),
                down: Duration::from_millis(20),
                period: Some(Duration::from_millis(100)),
            })
        );
        for (bad, says) in [
            ("link_down_ms=0", "above 0"),
            ("link_down_ms=x", "milliseconds"),
            ("link_down_ms=-5", "milliseconds"),
            ("link_flap_ms=20", "DOWN/PERIOD"),
            ("link_flap_ms=100/100", "0 < DOWN < PERIOD"),
            ("link_flap_ms=0/100", "0 < DOWN < PERIOD"),
            ("link_flap_ms=5/99999999999", "at most a day"),
            ("link_down_at_ms=5", "needs"),
        ] {
            let e = FaultConfig::parse(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn scheduled_outages_drop_what_is_offered_during_them() {
        let t = |ms: u64| Instant::ZERO + Duration::from_millis(ms);
        // One outage 10..40 ms after the first datagram (offered at 5 ms).
        let mut f = FaultInjector::<Vec<u8>>::new(
            FaultConfig::parse("link_down_ms=30,link_down_at_ms=10").unwrap(),
        );
        let got: Vec<Verdict> = [5, 14, 15, 30, 44, 45, 100]
            .into_iter()
            .map(|ms| f.push(t(ms), vec![1]))
            .collect();
        use Verdict::*;
        assert_eq!(
            got,
            [Delivered, Delivered, LinkDown, LinkDown, LinkDown, Delivered, Delivered]
        );
        assert_eq!(f.stats().link_down, 3);
        // Flapping: down 2 ms of every 10, from 0 ms after the first datagram.
        let mut f = FaultInjector::<Vec<u8>>::new(
            FaultConfig::parse("link_flap_ms=2/10,link_down_at_ms=0").unwrap(),
        );
        let down: Vec<u64> = (0..40)
            .filter(|&ms| f.push(t(ms), vec![1]) == LinkDown)
            .collect();
        assert_eq!(down, vec![0, 1, 10, 11, 20, 21, 30, 31]);
        assert!(f.is_link_up(), "scheduled outages leave set_link_up alone");
    }
}
