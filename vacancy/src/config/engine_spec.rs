//! A validated [`Config`] as the engine sees it: the config layer converts
//! into the engine's own spec, so the engine never imports the config.

use std::time::Duration;

use crate::config::{Config, ResourceConfig};
use crate::engine::{
    EngineSpec, HeatLimits, ModelBudget, QueueSpec, ReclaimPolicy, ResourceSpec, UpstreamSpec,
};

/// How far below `max_temperature_c` a GPU must cool before it lends again
/// when `resume_below_c` is not set.
pub const DEFAULT_RESUME_MARGIN_C: u32 = 5;

impl ResourceConfig {
    /// The GPU's heat and power limits (issue 35), if any is set.
    pub fn heat_limits(&self) -> Option<HeatLimits> {
        if self.max_temperature_c.is_none()
            && self.max_power_w.is_none()
            && self.max_fan_percent.is_none()
        {
            return None;
        }
        Some(HeatLimits {
            temperature: self.max_temperature_c.map(|max| {
                let resume = self
                    .resume_below_c
                    .unwrap_or_else(|| max.saturating_sub(DEFAULT_RESUME_MARGIN_C));
                (max, resume)
            }),
            max_power_w: self.max_power_w,
            max_fan_percent: self.max_fan_percent,
            hot_for: Duration::from_secs(self.hot_for_s),
        })
    }
}

impl From<&Config> for EngineSpec {
    /// The engine's view of a validated configuration.
    fn from(config: &Config) -> Self {
        EngineSpec {
            lending: config.server.lending,
            resources: config
                .resources
                .iter()
                .map(|r| ResourceSpec {
                    name: r.name.clone(),
                    kind: r.kind,
                    reserve_mib: r.reserve_mib,
                    enabled: r.enabled,
                    max_sample_age: Duration::from_millis(r.max_sample_age_ms),
                    busy_max_pct: r.busy_max_pct,
                    heat: r.heat_limits(),
                })
                .collect(),
            upstreams: config
                .upstreams
                .iter()
                .map(|u| UpstreamSpec {
                    name: u.name.clone(),
                    resource: u.resource.clone(),
                    also_requires: u.also_requires.clone(),
                    owner_scope: u.owner_scope,
                    default_min_free_mib: u.default_min_free_mib,
                    resident_min_free_mib: u.resident_min_free_mib,
                    models: u
                        .models
                        .iter()
                        .map(|(name, m)| {
                            (
                                name.clone(),
                                ModelBudget {
                                    min_free_mib: m.min_free_mib,
                                    resident_min_free_mib: m.resident_min_free_mib,
                                },
                            )
                        })
                        .collect(),
                    requirements: u
                        .requirements
                        .iter()
                        .map(|(name, r)| (name.clone(), r.min_free_mib))
                        .collect(),
                    reclaim: ReclaimPolicy {
                        on_owner_return: u.on_owner_return,
                        drain_timeout: Duration::from_secs(u.drain_timeout_s),
                        yield_on_veto: u.yield_on_veto,
                        completion_timeout: Duration::from_secs(u.completion_timeout_s),
                    },
                    queue: u.queue.map(|q| QueueSpec {
                        max_waiting: q.max_waiting,
                        max_wait: Duration::from_secs(q.max_wait_s),
                    }),
                })
                .collect(),
        }
    }
}
