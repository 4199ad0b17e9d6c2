//! Learned memory priors (MEM-07..11): measured model footprints, bounded, in memory only.

use std::collections::HashMap;

use crate::time::Moment;

/// The most model identities priors are kept for (MEM-10).
pub const MAX_PRIOR_IDENTITIES: usize = 128;

/// A footprint measurement under way on one resource.
///
/// # Behavior
///
/// Started at admission with the free memory the decision used; armed by the
/// first observation taken after admission that shows the model loaded; closed
/// by the first capacity sample taken after that observation (MEM-07). Any
/// other job or an unload on the resource abandons it, because the delta would
/// then mix in someone else's allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PendingFootprint {
    pub upstream: usize,
    pub model: String,
    pub free_at_admission: u64,
    pub admitted_at: Moment,
    pub observed_at: Option<Moment>,
}

#[derive(Debug, Clone, Default)]
struct PriorEntry {
    /// (resource index, learned MiB)
    per_resource: Vec<(usize, u64)>,
    last_used: u64,
}

/// Learned priors keyed by (upstream, model), least-recently-used eviction.
#[derive(Debug, Default)]
pub(crate) struct Priors {
    by_upstream: HashMap<usize, HashMap<String, PriorEntry>>,
    len: usize,
    tick: u64,
}

impl Priors {
    /// The learned footprint of `model` on `resource`, marking the identity as used.
    pub fn get(&mut self, upstream: usize, model: &str, resource: usize) -> Option<u64> {
        self.tick += 1;
        let tick = self.tick;
        let entry = self.by_upstream.get_mut(&upstream)?.get_mut(model)?;
        entry.last_used = tick;
        entry
            .per_resource
            .iter()
            .find(|(r, _)| *r == resource)
            .map(|(_, mib)| *mib)
    }

    /// The learned footprint without touching recency (for status and tests).
    pub fn peek(&self, upstream: usize, model: &str, resource: usize) -> Option<u64> {
        self.by_upstream
            .get(&upstream)?
            .get(model)?
            .per_resource
            .iter()
            .find(|(r, _)| *r == resource)
            .map(|(_, mib)| *mib)
    }

    /// Learn a measured delta. Non-positive deltas are not learned (MEM-09): the
    /// model may already have been resident. Keeps the larger of old and new, so
    /// the prior stays conservative.
    pub fn learn(&mut self, upstream: usize, model: &str, resource: usize, delta_mib: i128) {
        let Ok(mib) = u64::try_from(delta_mib) else {
            return;
        };
        if mib == 0 {
            return;
        }
        self.tick += 1;
        let tick = self.tick;
        let models = self.by_upstream.entry(upstream).or_default();
        if !models.contains_key(model) {
            self.len += 1;
        }
        let entry = models.entry(model.to_owned()).or_default();
        entry.last_used = tick;
        match entry.per_resource.iter_mut().find(|(r, _)| *r == resource) {
            Some((_, old)) => *old = (*old).max(mib),
            None => entry.per_resource.push((resource, mib)),
        }
        while self.len > MAX_PRIOR_IDENTITIES {
            self.evict_least_recent();
        }
    }

    /// How many identities are held.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    fn evict_least_recent(&mut self) {
        let oldest = self
            .by_upstream
            .iter()
            .flat_map(|(up, models)| models.iter().map(move |(m, e)| (e.last_used, *up, m)))
            .min_by_key(|(used, _, _)| *used)
            .map(|(_, up, m)| (up, m.clone()));
        if let Some((up, model)) = oldest
            && let Some(models) = self.by_upstream.get_mut(&up)
            && models.remove(&model).is_some()
        {
            self.len -= 1;
            if models.is_empty() {
                self.by_upstream.remove(&up);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_and_negative_deltas_are_not_learned() {
        // MEM-09
        let mut p = Priors::default();
        p.learn(0, "m", 0, 0);
        p.learn(0, "m", 0, -500);
        assert_eq!(p.peek(0, "m", 0), None);
        assert_eq!(p.len(), 0);
    }

    #[test]
    fn learning_keeps_the_larger_footprint() {
        // MEM-08: conservative
        let mut p = Priors::default();
        p.learn(0, "m", 0, 5000);
        p.learn(0, "m", 0, 3000);
        assert_eq!(p.peek(0, "m", 0), Some(5000));
        p.learn(0, "m", 0, 7000);
        assert_eq!(p.get(0, "m", 0), Some(7000));
    }

    #[test]
    fn bounded_to_128_identities_least_recently_used_goes() {
        // MEM-10
        let mut p = Priors::default();
        for i in 0..MAX_PRIOR_IDENTITIES {
            p.learn(0, &format!("m{i}"), 0, 100);
        }
        // Use m0 so m1 is the least recently used.
        assert_eq!(p.get(0, "m0", 0), Some(100));
        p.learn(1, "new", 0, 100);
        assert_eq!(p.len(), MAX_PRIOR_IDENTITIES);
        assert_eq!(p.peek(0, "m0", 0), Some(100));
        assert_eq!(p.peek(0, "m1", 0), None);
        assert_eq!(p.peek(1, "new", 0), Some(100));
    }
}
