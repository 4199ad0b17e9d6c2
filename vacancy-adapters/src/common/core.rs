//! What every adapter holds, built once: its settings, its checked route
//! table and the client of its own observation requests.

use vacancy::traits::routes::RouteOverlap;
use vacancy::traits::{RouteSpec, RouteTable};

use super::{AdapterSettings, ObservationClient};

/// An adapter's settings, route table and observation client.
///
/// # Behavior
///
/// [`AdapterCore::new`] checks the table (docs/adapter-guide.md#route-classes: no two entries may match
/// the same request) and connects nothing; the client sends
/// `[upstream.credential]` only (OBS-01/02).
#[derive(Debug)]
pub struct AdapterCore {
    settings: AdapterSettings,
    routes: RouteTable,
    observer: ObservationClient,
}

impl AdapterCore {
    /// The core of an adapter for `settings.target` answering `routes`.
    pub fn new(settings: AdapterSettings, routes: &[RouteSpec]) -> Result<Self, RouteOverlap> {
        Ok(AdapterCore {
            observer: ObservationClient::new(&settings),
            routes: RouteTable::new(routes.to_vec())?,
            settings,
        })
    }

    /// The same core answering another, already checked, table.
    pub fn with_table(mut self, routes: RouteTable) -> Self {
        self.routes = routes;
        self
    }

    /// The settings it was built with.
    pub fn settings(&self) -> &AdapterSettings {
        &self.settings
    }

    /// The route table, as [`vacancy::traits::Adapter::routes`] answers it.
    pub fn routes(&self) -> &RouteTable {
        &self.routes
    }

    /// The client for the adapter's own observation requests.
    pub fn observer(&self) -> &ObservationClient {
        &self.observer
    }
}
