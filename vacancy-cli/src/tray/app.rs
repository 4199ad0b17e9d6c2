//! The tray program: the icon and its menu on the main thread
//! (`vacancy_win32::tray`), the daemon's stream and the menu's admin calls
//! on a small runtime on a second thread. The two share the latest view.

use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::mpsc;
use tracing::{info, warn};
use vacancy_win32::tray::{MenuItem, TrayApp, TrayLook, Waker};

use super::token;
use super::view::TrayView;
use super::watch::follow;
use crate::admin::{self, Action};

const OPEN_CONSOLE: u32 = 1;
const SWITCH_LENDING: u32 = 2;
const QUIT: u32 = 3;

/// What the two threads share.
struct Shared {
    view: TrayView,
    /// The last menu action's outcome, shown under the sign's words until
    /// the sign's state changes.
    notice: Option<String>,
}

type SharedRef = Arc<Mutex<Shared>>;

fn lock(shared: &SharedRef) -> std::sync::MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

struct Tray {
    url: String,
    shared: SharedRef,
    orders: mpsc::UnboundedSender<bool>,
}

impl TrayApp for Tray {
    fn look(&mut self) -> TrayLook {
        let shared = lock(&self.shared);
        TrayLook {
            color: shared.view.color(),
            tooltip: shared.view.tooltip(),
        }
    }

    fn menu(&mut self) -> Vec<MenuItem> {
        let shared = lock(&self.shared);
        let mut items: Vec<MenuItem> = shared
            .view
            .lines
            .iter()
            .map(|l| MenuItem::Text(l.clone()))
            .collect();
        if let Some(notice) = &shared.notice {
            items.push(MenuItem::Text(notice.clone()));
        }
        items.push(MenuItem::Separator);
        items.push(MenuItem::Action {
            id: OPEN_CONSOLE,
            label: "&Open the console".to_owned(),
            enabled: true,
        });
        items.push(MenuItem::Action {
            id: SWITCH_LENDING,
            label: if shared.view.lending == Some(false) {
                "&Resume lending"
            } else {
                "&Pause lending"
            }
            .to_owned(),
            enabled: shared.view.lending.is_some(),
        });
        items.push(MenuItem::Separator);
        items.push(MenuItem::Action {
            id: QUIT,
            label: "&Quit the tray".to_owned(),
            enabled: true,
        });
        items
    }

    fn chosen(&mut self, id: u32) -> bool {
        match id {
            OPEN_CONSOLE => {
                let url = format!("{}/", self.url.trim_end_matches('/'));
                if let Err(e) = vacancy_win32::tray::open_url(&url) {
                    warn!(url = %url, error = %e, "cannot open the console");
                }
                true
            }
            SWITCH_LENDING => {
                let lending = lock(&self.shared).view.lending;
                if let Some(on) = lending {
                    let _ = self.orders.send(!on);
                }
                true
            }
            QUIT => {
                info!("tray quit from its menu");
                false
            }
            _ => true,
        }
    }
}

/// Run the tray for the daemon whose control listener is at `url`.
pub(crate) fn run(url: String) -> ExitCode {
    vacancy_win32::process::detach_console_if_alone();
    match crate::logging::from_env() {
        Ok(format) => crate::logging::init(format),
        Err(e) => {
            eprintln!("vacancyd tray: {e}");
            return ExitCode::FAILURE;
        }
    }
    let shared = Arc::new(Mutex::new(Shared {
        view: TrayView::not_running(&url),
        notice: None,
    }));
    let (orders, order_rx) = mpsc::unbounded_channel();
    let app = Tray {
        url: url.clone(),
        shared: Arc::clone(&shared),
        orders,
    };
    let started = |waker: Waker| {
        let spawned = std::thread::Builder::new()
            .name("tray-daemon".to_owned())
            .spawn(move || watch(&url, &shared, order_rx, waker));
        if let Err(e) = spawned {
            warn!(error = %e, "cannot start the thread that follows the daemon");
            waker.quit();
        }
    };
    info!("tray started");
    match vacancy_win32::tray::run(Box::new(app), started) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vacancyd tray: cannot show the icon: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The second thread: follow the daemon, and carry out the menu's orders.
fn watch(url: &str, shared: &SharedRef, mut orders: mpsc::UnboundedReceiver<bool>, waker: Waker) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            warn!(error = %e, "cannot start the tray's runtime");
            waker.quit();
            return;
        }
    };
    rt.block_on(async {
        let show = |view: TrayView| {
            info!(
                state = view.state_name(),
                lines = %serde_json::to_string(&view.lines).unwrap_or_default(),
                tooltip = %view.tooltip(),
                "tray shows"
            );
            let mut now = lock(shared);
            // A notice speaks of the state it was given in.
            if now.view.state != view.state {
                now.notice = None;
            }
            now.view = view;
            drop(now);
            waker.wake();
        };
        let follow = follow(url, show);
        let act = async {
            while let Some(on) = orders.recv().await {
                let notice = switch_lending(url, on).await;
                lock(shared).notice = Some(notice);
                waker.wake();
            }
        };
        tokio::join!(follow, act);
    });
}

/// Turn lending on or off with the owner's kept token (else
/// `VACANCYD_TOKEN`, else the local administration pipe, which admits only
/// administrators); what happened, in words for the menu.
async fn switch_lending(url: &str, on: bool) -> String {
    let word = if on { "on" } else { "off" };
    let action = match Action::parse(&["lending".to_owned(), word.to_owned()]) {
        Ok(a) => a,
        Err(e) => return e.to_string(),
    };
    let credential = match token::load() {
        Ok(Some(t)) => admin::Credential::Token(t),
        Ok(None) => match admin::credential(None) {
            Ok(c) => c,
            Err(e) => return e.to_string(),
        },
        Err(e) => {
            warn!(error = %e, "cannot open the tray's token");
            return e.to_string();
        }
    };
    match admin::send_with(url, &credential, &action).await {
        Ok(_) => {
            let done = if on {
                "Lending resumed"
            } else {
                "Lending paused"
            };
            info!(lending = on, "tray switched lending");
            done.to_owned()
        }
        Err(e) => {
            warn!(lending = on, error = %e, "tray could not switch lending");
            format!(
                "Could not turn lending {word}: {e}. Save the owner's token with `vacancyd tray --save-token`."
            )
        }
    }
}
