//! What the tray shows, from the daemon's `/status`: the sign's state for
//! the icon and the sign's own words (the `sign` the daemon makes with
//! `vacancy::engine::sign`, which the console shows too) for the tooltip and
//! the menu's first lines, as they are (SCOPE-17). Pure, so every build
//! tests it.

use serde_json::Value;

/// Seconds between attempts to reach a daemon that is not running.
pub const RETRY_SECS: u64 = 2;

/// The icon's state: one of the sign's states, or no daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrayState {
    /// The daemon's sign state (`held`, `paused`, `owner_present`,
    /// `lending`, `admitting`, `refusing`).
    Sign(String),
    /// The daemon could not be reached.
    NotRunning,
}

/// What the tray shows now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrayView {
    /// For the icon.
    pub state: TrayState,
    /// The words: the sign's headline, detail and attention line.
    pub lines: Vec<String>,
    /// The lending switch, when known: which of pause and resume the menu offers.
    pub lending: Option<bool>,
}

/// Why a `/status` document could not be shown.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the daemon's status has no sign ({0}); is vacancyd older than this tray?")]
pub struct NoSign(&'static str);

impl TrayView {
    /// The view of a `/status` document.
    ///
    /// # Errors
    ///
    /// When it carries no sign (a daemon from before the sign).
    pub fn of_status(status: &Value) -> Result<TrayView, NoSign> {
        let sign = &status["sign"];
        let state = sign["state"].as_str().ok_or(NoSign("sign.state"))?;
        let headline = sign["headline"].as_str().ok_or(NoSign("sign.headline"))?;
        let mut lines = vec![headline.to_owned()];
        for key in ["detail", "attention"] {
            if let Some(text) = sign[key].as_str()
                && !text.is_empty()
            {
                lines.push(text.to_owned());
            }
        }
        Ok(TrayView {
            state: TrayState::Sign(state.to_owned()),
            lines,
            lending: status["lending"].as_bool(),
        })
    }

    /// The view while the daemon at `url` cannot be reached.
    pub fn not_running(url: &str) -> TrayView {
        TrayView {
            state: TrayState::NotRunning,
            lines: vec![
                "vacancyd is not running".to_owned(),
                format!(
                    "Trying {url} again every {RETRY_SECS} s; start the vacancyd service (services.msc) if it stays stopped"
                ),
            ],
            lending: None,
        }
    }

    /// The state's name, as the log and the tests say it.
    pub fn state_name(&self) -> &str {
        match &self.state {
            TrayState::Sign(s) => s,
            TrayState::NotRunning => "not_running",
        }
    }

    /// The tooltip: "vacancyd: " and the lines, one a line, cut to the 127
    /// characters (UTF-16 units) Windows shows, with "…" where cut.
    pub fn tooltip(&self) -> String {
        let full = format!("vacancyd: {}", self.lines.join("\n"));
        if full.encode_utf16().count() <= 127 {
            return full;
        }
        let mut out = String::new();
        let mut units = 0;
        for c in full.chars() {
            if units + c.len_utf16() > 126 {
                break;
            }
            units += c.len_utf16();
            out.push(c);
        }
        out.push('…');
        out
    }

    /// The icon's colour: green admitting, blue lending, amber for the
    /// owner's policy, grey paused or refusing, red for held work or no daemon.
    pub fn color(&self) -> [u8; 3] {
        match self.state_name() {
            "admitting" => [0x2e, 0xa0, 0x43],
            "lending" => [0x1f, 0x6f, 0xeb],
            "owner_present" => [0xd2, 0x99, 0x22],
            "paused" | "refusing" => [0x8b, 0x94, 0x9e],
            _ => [0xda, 0x36, 0x33],
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn status(state: &str, headline: &str, detail: &str, attention: Option<&str>) -> Value {
        serde_json::json!({
            "lending": true,
            "sign": {"state": state, "headline": headline, "detail": detail,
                     "exempt_lending": [], "attention": attention}
        })
    }

    // SCOPE-17: the tray shows the daemon's words as they are.
    #[test]
    fn scope_17_the_tray_shows_the_signs_words_as_they_are() {
        let v = TrayView::of_status(&status(
            "owner_present",
            "Only exempt routes are lending",
            "Owner policy pauses host-scoped routes (the owner is present); exempt routes still lending: tts",
            None,
        ))
        .unwrap();
        assert_eq!(v.state_name(), "owner_present");
        assert_eq!(
            v.lines,
            vec![
                "Only exempt routes are lending",
                "Owner policy pauses host-scoped routes (the owner is present); exempt routes still lending: tts"
            ]
        );
        assert_eq!(v.lending, Some(true));
    }

    #[test]
    fn held_work_adds_its_line_and_an_empty_detail_none() {
        let v = TrayView::of_status(&status(
            "held",
            "Owner policy allows new work",
            "",
            Some("1 held entry needs attention"),
        ))
        .unwrap();
        assert_eq!(
            v.lines,
            vec![
                "Owner policy allows new work",
                "1 held entry needs attention"
            ]
        );
        assert_eq!(v.color(), [0xda, 0x36, 0x33]);
    }

    #[test]
    fn a_status_without_a_sign_is_an_error_naming_the_field() {
        let e = TrayView::of_status(&serde_json::json!({"lending": true})).unwrap_err();
        assert!(e.to_string().contains("sign.state"), "{e}");
    }

    #[test]
    fn the_tooltip_fits_windows_127_characters() {
        let long = "x".repeat(300);
        let v = TrayView::of_status(&status(
            "admitting",
            "Owner policy allows new work",
            &long,
            None,
        ))
        .unwrap();
        let tip = v.tooltip();
        assert_eq!(tip.encode_utf16().count(), 127);
        assert!(tip.starts_with("vacancyd: Owner policy allows new work\n"));
        assert!(tip.ends_with('…'));
        let short = TrayView::of_status(&status(
            "paused",
            "Lending is paused by its switch",
            "",
            None,
        ))
        .unwrap();
        assert_eq!(short.tooltip(), "vacancyd: Lending is paused by its switch");
    }

    #[test]
    fn without_a_daemon_it_says_so_and_that_it_retries() {
        let v = TrayView::not_running("http://127.0.0.1:7480");
        assert_eq!(v.state_name(), "not_running");
        assert_eq!(v.lines[0], "vacancyd is not running");
        assert!(v.lines[1].contains("again every 2 s"));
        assert_eq!(v.lending, None);
    }
}
