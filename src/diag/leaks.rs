//! Leak reports: live arrays grouped by the source line that created them, and
//! [`LeakWatch`], which notices a manager whose live count keeps rising.

use super::human_bytes;
use crate::engine::{self, MgrId};
use crate::{MemoryStats, NDManager};
use std::collections::HashMap;
use std::fmt;

/// Live arrays created at one source line and owned by one manager.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeakSite {
    /// `file:line:column` of the creating call.
    pub location: String,
    /// Live arrays created there.
    pub count: usize,
    /// Bytes they hold (views count 0: they share their base's buffer).
    pub bytes: usize,
    /// Name of the owning manager.
    pub manager: String,
}

/// Live arrays grouped by creation site, largest first (by bytes, then count).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeakReport {
    /// One entry per (creation site, owning manager).
    pub sites: Vec<LeakSite>,
}

impl LeakReport {
    /// Total live arrays in the report.
    pub fn total_arrays(&self) -> usize {
        self.sites.iter().map(|s| s.count).sum()
    }

    /// Total bytes in the report.
    pub fn total_bytes(&self) -> usize {
        self.sites.iter().map(|s| s.bytes).sum()
    }
}

impl fmt::Display for LeakReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} live arrays, {} by creation site:",
            self.total_arrays(),
            human_bytes(self.total_bytes())
        )?;
        writeln!(
            f,
            "{:>8}  {:>10}  {:<20}  site",
            "arrays", "bytes", "manager"
        )?;
        for s in &self.sites {
            writeln!(
                f,
                "{:>8}  {:>10}  {:<20}  {}",
                s.count,
                human_bytes(s.bytes),
                s.manager,
                s.location
            )?;
        }
        Ok(())
    }
}

/// Group the live arrays of `root` (and its subtree if `subtree`) by creation site.
/// O(arrays visited).
pub(crate) fn report(root: MgrId, subtree: bool) -> LeakReport {
    let managers: Vec<MgrId> = if subtree {
        engine::manager_tree(root)
            .map(|t| t.into_iter().map(|(id, ..)| id).collect())
            .unwrap_or_default()
    } else {
        vec![root]
    };
    let mut groups: HashMap<(usize, MgrId), (crate::SourceLocation, usize, usize)> = HashMap::new();
    for a in engine::live_arrays(&managers) {
        let key = (a.created_at as *const _ as usize, a.manager);
        let e = groups.entry(key).or_insert((a.created_at, 0, 0));
        e.1 += 1;
        e.2 += a.bytes;
    }
    let mut sites: Vec<LeakSite> = groups
        .into_iter()
        .map(|((_, mid), (loc, count, bytes))| LeakSite {
            location: loc.to_string(),
            count,
            bytes,
            manager: engine::manager_name(mid).unwrap_or_default(),
        })
        .collect();
    sites.sort_by(|a, b| {
        (b.bytes, b.count)
            .cmp(&(a.bytes, a.count))
            .then_with(|| a.location.cmp(&b.location))
    });
    LeakReport { sites }
}

/// Every live array of the process, grouped by creation site.
pub fn leak_report() -> LeakReport {
    report(engine::SYSTEM, true)
}

impl NDManager {
    /// This manager's live arrays (its subtree's) grouped by creation site, largest
    /// first: a growing manager points at its cause.
    ///
    /// ```
    /// use ndscope::{DType, NDManager};
    /// let m = NDManager::new();
    /// let w = m.ones([4], DType::F32);
    /// for _ in 0..10 {
    ///     let _leak = w * 0.1; // no scope: each result stays in `m`
    /// }
    /// let report = m.leak_report();
    /// assert_eq!(report.sites[0].count, 10);
    /// assert!(report.sites[0].location.starts_with(file!()));
    /// ```
    pub fn leak_report(&self) -> LeakReport {
        report(self.id, true)
    }
}

/// Fails with the process's leak report if more arrays or bytes are live than in
/// `baseline` (taken with [`crate::memory()`] before the code under test).
pub fn check_leaks(baseline: &MemoryStats) -> Result<(), LeakReport> {
    let now = crate::memory();
    if now.live_arrays > baseline.live_arrays || now.live_bytes > baseline.live_bytes {
        return Err(leak_report());
    }
    Ok(())
}

/// Panics with the leak report if more arrays or bytes are live than in `baseline`.
///
/// ```
/// let baseline = ndscope::memory();
/// let m = ndscope::NDManager::new();
/// let _a = m.zeros([8], ndscope::DType::F32);
/// m.close();
/// ndscope::assert_no_leaks(&baseline);
/// ```
#[track_caller]
pub fn assert_no_leaks(baseline: &MemoryStats) {
    if let Err(report) = check_leaks(baseline) {
        panic!(
            "arrays leaked: {} live arrays now, {} at the baseline\n{report}",
            crate::memory().live_arrays,
            baseline.live_arrays
        );
    }
}

/// Watches one manager (or the whole process) for steady growth.
///
/// Call [`LeakWatch::check`] once per loop iteration, epoch or scope close. When the
/// manager's live array count has risen at `threshold` consecutive checks (3 by
/// default), it logs a warning through the `log` crate (target `ndscope::leak`) with
/// the top creation sites and returns it; while the growth continues it warns again
/// each time the streak doubles.
///
/// ```
/// use ndscope::{DType, LeakWatch, NDManager};
/// let m = NDManager::new();
/// let w = m.ones([2], DType::F32);
/// let mut watch = LeakWatch::new(&m);
/// let mut warnings = 0;
/// for _ in 0..10 {
///     let _intermediate = w * 0.5; // leaks into `m`
///     warnings += watch.check().is_some() as usize;
/// }
/// assert!(warnings > 0);
/// ```
#[derive(Debug)]
pub struct LeakWatch {
    manager: NDManager,
    threshold: usize,
    last: Option<usize>,
    start: usize,
    streak: usize,
    next_warning: usize,
}

/// What [`LeakWatch::check`] found.
#[derive(Clone, Debug)]
pub struct LeakWarning {
    /// The watched manager's name.
    pub manager: String,
    /// Its live arrays now.
    pub live_arrays: usize,
    /// Arrays added since the growth streak began.
    pub growth: usize,
    /// Consecutive checks with growth.
    pub checks: usize,
    /// The largest creation sites.
    pub top_sites: Vec<LeakSite>,
}

impl fmt::Display for LeakWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "manager '{}' grew by {} arrays over {} consecutive checks ({} live); top creation sites:",
            self.manager, self.growth, self.checks, self.live_arrays
        )?;
        for s in &self.top_sites {
            write!(
                f,
                "\n  {} arrays, {} at {}",
                s.count,
                human_bytes(s.bytes),
                s.location
            )?;
        }
        Ok(())
    }
}

impl LeakWatch {
    /// Watch `manager` (and its subtree).
    pub fn new(manager: &NDManager) -> Self {
        LeakWatch {
            manager: manager.clone(),
            threshold: 3,
            last: None,
            start: 0,
            streak: 0,
            next_warning: 3,
        }
    }

    /// Watch every array of the process.
    pub fn global() -> Self {
        LeakWatch::new(&NDManager::system())
    }

    /// Warn after `n` (at least 1) consecutive rising checks.
    pub fn with_threshold(mut self, n: usize) -> Self {
        self.threshold = n.max(1);
        self.next_warning = self.threshold;
        self
    }

    /// Record the current live count; returns a warning when growth is persistent.
    pub fn check(&mut self) -> Option<LeakWarning> {
        let live = self.manager.memory().live_arrays;
        let rose = self.last.is_some_and(|l| live > l);
        if rose {
            if self.streak == 0 {
                self.start = self.last.unwrap_or(live);
            }
            self.streak += 1;
        } else {
            self.streak = 0;
            self.next_warning = self.threshold;
        }
        self.last = Some(live);
        if self.streak == 0 || self.streak < self.next_warning {
            return None;
        }
        self.next_warning = self.streak * 2;
        let mut top_sites = self.manager.leak_report().sites;
        top_sites.truncate(3);
        let warning = LeakWarning {
            manager: self.manager.name(),
            live_arrays: live,
            growth: live - self.start,
            checks: self.streak,
            top_sites,
        };
        log::warn!(target: "ndscope::leak", "{warning}");
        Some(warning)
    }
}
