//! Results as perftest prints and exchanges them: bandwidth and latency
//! reports, their fields and their lines.

use super::*;

/// A bandwidth result (`struct bw_report_data`'s exchanged fields).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BwReport {
    /// Message size.
    pub size: u64,
    /// Messages.
    pub iters: u64,
    /// Best rate over any run of messages, in report units (0 if none).
    pub bw_peak: f64,
    /// Average rate, in report units.
    pub bw_avg: f64,
    /// Millions of messages per second.
    pub msg_rate: f64,
}

impl BwReport {
    /// The five 8-byte fields in exchange order.
    pub fn to_fields(&self) -> [[u8; 8]; 5] {
        [
            self.size.to_be_bytes(),
            self.iters.to_be_bytes(),
            self.bw_peak.to_bits().to_be_bytes(),
            self.bw_avg.to_bits().to_be_bytes(),
            self.msg_rate.to_bits().to_be_bytes(),
        ]
    }

    /// Reads the five fields.
    pub fn from_fields(f: [[u8; 8]; 5]) -> BwReport {
        let d = |b: [u8; 8]| f64::from_bits(u64::from_be_bytes(b));
        BwReport {
            size: u64::from_be_bytes(f[0]),
            iters: u64::from_be_bytes(f[1]),
            bw_peak: d(f[2]),
            bw_avg: d(f[3]),
            msg_rate: d(f[4]),
        }
    }

    /// Computes a report from per-message post and completion times
    /// (seconds from any epoch, in message order) the way perftest does:
    /// the average over first post to last completion, the peak as the
    /// best rate of any run of messages (none above 20000 messages).
    pub fn from_times(size: u64, posted: &[f64], completed: &[f64], gbits: bool) -> BwReport {
        let n = posted.len().min(completed.len());
        let unit = if gbits { 125_000_000.0 } else { 1_048_576.0 };
        if n == 0 {
            return BwReport {
                size,
                iters: 0,
                bw_peak: 0.0,
                bw_avg: 0.0,
                msg_rate: 0.0,
            };
        }
        let mut r = BwReport::from_span(size, n as u64, completed[n - 1] - posted[0], gbits);
        if n as u64 <= PEAK_MAX_ITERS {
            // perftest samples completions every cq_mod (100) messages.
            let step = 100.min(n);
            let mut best = f64::INFINITY;
            for (i, &p) in posted[..n].iter().enumerate() {
                let mut j = (i + 1).div_ceil(step) * step - 1;
                while j < n {
                    best = best.min((completed[j] - p) / (j - i + 1) as f64);
                    j += step;
                }
                best = best.min((completed[n - 1] - p) / (n - i) as f64);
            }
            if best > 0.0 && best.is_finite() {
                r.bw_peak = size as f64 / best / unit;
            }
        }
        r
    }

    /// A report of `iters` messages in `seconds`, without a peak.
    pub fn from_span(size: u64, iters: u64, seconds: f64, gbits: bool) -> BwReport {
        let unit = if gbits { 125_000_000.0 } else { 1_048_576.0 };
        let t = seconds.max(1e-9);
        BwReport {
            size,
            iters,
            bw_peak: 0.0,
            bw_avg: size as f64 * iters as f64 / t / unit,
            msg_rate: iters as f64 / t / 1e6,
        }
    }

    /// perftest's result line: two decimals (`REPORT_FMT`), or six when
    /// the average is under 0.1 Gb/s (`REPORT_FMT_EXT`, which perftest
    /// uses only for Gb/s), so a slow run does not read as 0.00.
    pub fn line(&self, gbits: bool) -> String {
        if gbits && self.bw_avg < 0.1 {
            format!(
                " {:<7}    {}           {:<7.6}            {:<7.6}            {:<7.6}",
                self.size, self.iters, self.bw_peak, self.bw_avg, self.msg_rate
            )
        } else {
            format!(
                " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}",
                self.size, self.iters, self.bw_peak, self.bw_avg, self.msg_rate
            )
        }
    }
}

/// A latency result (`print_report_lat`), in microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatReport {
    /// Message size.
    pub size: u64,
    /// Messages.
    pub iters: u64,
    /// Smallest sample.
    pub min: f64,
    /// The second largest sample: perftest leaves the two largest out of
    /// the statistics and prints the smaller of them as the max.
    pub max: f64,
    /// The median.
    pub typical: f64,
    /// The mean.
    pub avg: f64,
    /// The standard deviation.
    pub stdev: f64,
    /// The 99th percentile.
    pub p99: f64,
    /// The 99.9th percentile.
    pub p999: f64,
}

/// Samples perftest drops from the top (`LAT_MEASURE_TAIL`).
pub(super) const LAT_TAIL: usize = 2;

/// Fewest iterations perftest runs (`MIN_ITER`).
pub const MIN_ITERS: u64 = 5;

impl LatReport {
    /// perftest's report from post times (seconds, in message order; each
    /// post after the previous completion): the samples are the times
    /// between consecutive posts, one round trip each for READ and atomics
    /// (`rtt_factor` 1). Sorted, the two largest left out of the median,
    /// mean and deviation; the max and the percentiles index the sorted
    /// samples at the kept count, and at it times 0.99 and 0.999 rounded
    /// up, as perftest's do. The standard deviation is the
    /// true one (perftest truncates each difference to an integer).
    /// `None` with fewer than [`MIN_ITERS`] posts.
    pub fn from_posts(size: u64, posted: &[f64]) -> Option<LatReport> {
        if (posted.len() as u64) < MIN_ITERS {
            return None;
        }
        let mut d: Vec<f64> = posted.windows(2).map(|w| (w[1] - w[0]) * 1e6).collect();
        d.sort_by(f64::total_cmp);
        let m = d.len() - LAT_TAIL;
        let typical = if (m - 1) % 2 == 1 {
            (d[m / 2] + d[m / 2 - 1]) / 2.0
        } else {
            d[m / 2]
        };
        let avg = d[..m].iter().sum::<f64>() / m as f64;
        let var = d[..m].iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / m as f64;
        let at = |q: f64| d[((m as f64 * q).ceil() as usize).min(d.len() - 1)];
        Some(LatReport {
            size,
            iters: posted.len() as u64,
            min: d[0],
            max: d[m],
            typical,
            avg,
            stdev: var.sqrt(),
            p99: at(0.99),
            p999: at(0.999),
        })
    }

    /// perftest's result line (`REPORT_FMT_LAT`).
    pub fn line(&self) -> String {
        format!(
            " {:<7} {}          {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2} \t\t{:<7.2}",
            self.size,
            self.iters,
            self.min,
            self.max,
            self.typical,
            self.avg,
            self.stdev,
            self.p99,
            self.p999
        )
    }
}

/// perftest's latency result header (`RESULT_FMT_LAT`).
pub const LAT_HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ";

/// A dashed line as perftest prints around results.
pub const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------";

/// perftest's result header for MB/s or Gb/s.
pub fn result_header(gbits: bool) -> &'static str {
    if gbits {
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
    } else {
        " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
    }
}
