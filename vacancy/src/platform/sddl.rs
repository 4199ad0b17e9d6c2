//! Windows security descriptors as data, read from their SDDL form.
//!
//! Windows writes a descriptor as a string
//! (`O:BAD:P(A;OICI;FA;;;BA)(A;OICI;FA;;;SY)`: owner Administrators, a
//! protected DACL allowing full access to Administrators and LocalSystem).
//! The Windows side of the seam reads a real path's descriptor in that form
//! (`vacancy_win32::security::descriptor_sddl`) and this module parses it, so
//! the decisions about it ([`super::access`]) are pure functions that every
//! build tests, from descriptors written by hand: Wine does not keep the
//! owner or DACL a program sets, so it cannot show the accepting side.
//!
//! Only what those decisions need is kept: the owner, whether the DACL is
//! present and protected, and each ACE's type, flags, rights and account.
//! Conditional expressions and object GUIDs are read past, not interpreted.

use std::fmt;

/// An account or group: a SID string (`S-1-5-32-544`), or a two-letter
/// SDDL alias this module does not resolve (`DA`, a domain's admins, is
/// relative to a domain it cannot know), kept as written.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Sid(String);

/// Administrators (`BA`).
pub const ADMINISTRATORS: &str = "S-1-5-32-544";
/// LocalSystem (`SY`).
pub const LOCAL_SYSTEM: &str = "S-1-5-18";

/// SDDL's aliases of well-known SIDs that are the same on every machine,
/// with the names Windows shows for them.
const ALIASES: &[(&str, &str, &str)] = &[
    ("AN", "S-1-5-7", "ANONYMOUS LOGON"),
    ("AO", "S-1-5-32-548", "Account Operators"),
    ("AU", "S-1-5-11", "Authenticated Users"),
    ("AC", "S-1-15-2-1", "ALL APPLICATION PACKAGES"),
    ("BA", ADMINISTRATORS, "Administrators"),
    ("BG", "S-1-5-32-546", "Guests"),
    ("BO", "S-1-5-32-551", "Backup Operators"),
    ("BU", "S-1-5-32-545", "Users"),
    ("CG", "S-1-3-1", "CREATOR GROUP"),
    ("CO", "S-1-3-0", "CREATOR OWNER"),
    ("IU", "S-1-5-4", "INTERACTIVE"),
    ("LS", "S-1-5-19", "LOCAL SERVICE"),
    ("NS", "S-1-5-20", "NETWORK SERVICE"),
    ("NU", "S-1-5-2", "NETWORK"),
    ("OW", "S-1-3-4", "OWNER RIGHTS"),
    ("PS", "S-1-5-10", "SELF"),
    ("PU", "S-1-5-32-547", "Power Users"),
    ("RC", "S-1-5-12", "RESTRICTED"),
    ("RD", "S-1-5-32-555", "Remote Desktop Users"),
    ("SO", "S-1-5-32-549", "Server Operators"),
    ("SU", "S-1-5-6", "SERVICE"),
    ("SY", LOCAL_SYSTEM, "LocalSystem"),
    ("WD", "S-1-1-0", "Everyone"),
    ("WR", "S-1-5-33", "WRITE RESTRICTED"),
];

impl Sid {
    /// The account `text` names: a SID string, or an SDDL alias (resolved
    /// when it is one of the well-known ones, else kept as written).
    pub fn new(text: &str) -> Sid {
        let text = text.trim();
        if let Some((_, sid, _)) = ALIASES.iter().find(|(a, _, _)| *a == text) {
            return Sid((*sid).to_owned());
        }
        Sid(text.to_ascii_uppercase())
    }

    /// The SID string, or the unresolved alias.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Sid {
    /// `Everyone (S-1-1-0)` for a well-known account, else the SID itself.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match ALIASES.iter().find(|(_, sid, _)| *sid == self.0) {
            Some((_, sid, name)) => write!(f, "{name} ({sid})"),
            None => f.write_str(&self.0),
        }
    }
}

/// Whether an ACE allows, denies, or does something else (audits, labels).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AceKind {
    /// `A`, `OA`, `XA`, `ZA`: grants its rights.
    Allow,
    /// `D`, `OD`, `XD`: refuses its rights.
    Deny,
    /// Anything else (`AU`, `ML`, ...): grants nothing.
    Other,
}

/// One access control entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ace {
    /// Allow, deny or other.
    pub kind: AceKind,
    /// `IO`: the entry only passes to children, it does not apply here.
    pub inherit_only: bool,
    /// `OI` or `CI`: children inherit it (files or folders).
    pub inheritable: bool,
    /// `ID`: inherited from the parent.
    pub inherited: bool,
    /// The access mask.
    pub rights: u32,
    /// The account it names.
    pub sid: Sid,
}

/// A DACL: whether it is protected from inheritance, and its entries.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Dacl {
    /// `P`: the parent's inheritable entries do not flow in.
    pub protected: bool,
    /// The entries, in order.
    pub aces: Vec<Ace>,
}

/// A security descriptor's owner and DACL.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Descriptor {
    /// `O:`, when the string has one.
    pub owner: Option<Sid>,
    /// `D:`; `None` when the string has none or says `NO_ACCESS_CONTROL`
    /// (a NULL DACL: everyone has full access).
    pub dacl: Option<Dacl>,
}

/// An SDDL string that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot read the security descriptor {sddl:?}: {why}")]
pub struct SddlError {
    /// The string.
    pub sddl: String,
    /// What is wrong with it.
    pub why: String,
}

/// Generic and standard rights, and the file rights SDDL abbreviates.
const RIGHTS: &[(&str, u32)] = &[
    ("GA", 0x1000_0000),
    ("GR", 0x8000_0000),
    ("GW", 0x4000_0000),
    ("GX", 0x2000_0000),
    ("RC", 0x0002_0000),
    ("SD", 0x0001_0000),
    ("WD", 0x0004_0000),
    ("WO", 0x0008_0000),
    ("RP", 0x0000_0010),
    ("WP", 0x0000_0020),
    ("CC", 0x0000_0001),
    ("DC", 0x0000_0002),
    ("LC", 0x0000_0004),
    ("SW", 0x0000_0008),
    ("LO", 0x0000_0080),
    ("DT", 0x0000_0040),
    ("CR", 0x0000_0100),
    ("FA", 0x001F_01FF),
    ("FR", 0x0012_0089),
    ("FW", 0x0012_0116),
    ("FX", 0x0012_00A0),
    ("KA", 0x000F_003F),
    ("KR", 0x0002_0019),
    ("KW", 0x0002_0006),
    ("KX", 0x0002_0019),
];

/// Parse `sddl` into the parts [`super::access`] judges.
///
/// # Errors
///
/// [`SddlError`] naming what could not be read: an unknown section, an
/// unclosed entry, an entry without six fields, unknown rights.
pub fn parse(sddl: &str) -> Result<Descriptor, SddlError> {
    let fail = |why: String| SddlError {
        sddl: sddl.to_owned(),
        why,
    };
    let mut descriptor = Descriptor::default();
    let mut rest = sddl.trim();
    while !rest.is_empty() {
        let (tag, body) = match rest.split_at_checked(2) {
            Some((tag, body)) if tag.ends_with(':') => (&tag[..1], body),
            _ => return Err(fail(format!("expected O:, G:, D: or S: at {rest:?}"))),
        };
        let end = next_section(body);
        let (section, after) = body.split_at(end);
        match tag {
            "O" => descriptor.owner = Some(Sid::new(section)),
            "G" => {}
            "D" => descriptor.dacl = parse_acl(section).map_err(fail)?,
            "S" => {}
            other => return Err(fail(format!("unknown section {other}:"))),
        }
        rest = after;
    }
    Ok(descriptor)
}

/// Where the section starting at `body` ends: at the next `X:` outside an
/// entry's parentheses.
fn next_section(body: &str) -> usize {
    let bytes = body.as_bytes();
    let mut depth = 0usize;
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'(' => depth += 1,
            b')' => depth = depth.saturating_sub(1),
            b'O' | b'G' | b'D' | b'S' if depth == 0 && bytes.get(i + 1) == Some(&b':') => {
                return i;
            }
            _ => {}
        }
    }
    body.len()
}

/// A DACL section: flags, then entries. `None` for a NULL DACL.
fn parse_acl(section: &str) -> Result<Option<Dacl>, String> {
    let start = section.find('(').unwrap_or(section.len());
    let (flags, mut entries) = section.split_at(start);
    if flags.contains("NO_ACCESS_CONTROL") {
        return Ok(None);
    }
    let mut protected = false;
    let mut rest = flags;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("AI").or_else(|| rest.strip_prefix("AR")) {
            rest = r;
        } else if let Some(r) = rest.strip_prefix('P') {
            protected = true;
            rest = r;
        } else {
            return Err(format!("unknown DACL flags {flags:?}"));
        }
    }
    let mut dacl = Dacl {
        protected,
        aces: Vec::new(),
    };
    while !entries.is_empty() {
        let Some(inner) = entries.strip_prefix('(') else {
            return Err(format!("expected an entry in parentheses at {entries:?}"));
        };
        let close = closing(inner).ok_or_else(|| format!("unclosed entry at {entries:?}"))?;
        dacl.aces.push(parse_ace(&inner[..close])?);
        entries = &inner[close + 1..];
    }
    Ok(Some(dacl))
}

/// The index of the `)` that closes an entry opened just before `text`.
fn closing(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' if depth == 0 => return Some(i),
            ')' => depth -= 1,
            _ => {}
        }
    }
    None
}

/// `type;flags;rights;object guid;inherited object guid;account[;condition]`.
fn parse_ace(text: &str) -> Result<Ace, String> {
    let fields: Vec<&str> = text.splitn(7, ';').collect();
    let [kind, flags, rights, _, _, sid, ..] = fields.as_slice() else {
        return Err(format!("the entry ({text}) does not have six fields"));
    };
    let kind = match *kind {
        "A" | "OA" | "XA" | "ZA" => AceKind::Allow,
        "D" | "OD" | "XD" => AceKind::Deny,
        _ => AceKind::Other,
    };
    let has = |code: &str| two_letter(flags).any(|f| f == code);
    Ok(Ace {
        kind,
        inherit_only: has("IO"),
        inheritable: has("OI") || has("CI"),
        inherited: has("ID"),
        rights: parse_rights(rights).map_err(|why| format!("the entry ({text}): {why}"))?,
        sid: Sid::new(sid),
    })
}

fn two_letter(text: &str) -> impl Iterator<Item = &str> {
    (0..text.len() / 2).filter_map(move |i| text.get(2 * i..2 * i + 2))
}

/// A hex mask (`0x1200a9`), a decimal one, or two-letter codes (`GRGX`).
fn parse_rights(text: &str) -> Result<u32, String> {
    let text = text.trim();
    if let Some(hex) = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        return u32::from_str_radix(hex, 16).map_err(|e| format!("rights {text:?}: {e}"));
    }
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse::<u32>()
            .map_err(|e| format!("rights {text:?}: {e}"));
    }
    if !text.len().is_multiple_of(2) {
        return Err(format!("rights {text:?} are not two-letter codes"));
    }
    let mut mask = 0;
    for code in two_letter(text) {
        let (_, bits) = RIGHTS
            .iter()
            .find(|(c, _)| *c == code)
            .ok_or_else(|| format!("unknown right {code:?}"))?;
        mask |= bits;
    }
    Ok(mask)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_protected_dacl_for_administrators_and_system() {
        let d = parse("O:BAG:SYD:P(A;OICI;FA;;;BA)(A;OICI;FA;;;SY)").unwrap();
        assert_eq!(d.owner, Some(Sid::new(ADMINISTRATORS)));
        let dacl = d.dacl.unwrap();
        assert!(dacl.protected);
        assert_eq!(dacl.aces.len(), 2);
        assert_eq!(dacl.aces[0].kind, AceKind::Allow);
        assert_eq!(dacl.aces[0].rights, 0x001F_01FF);
        assert!(dacl.aces[0].inheritable && !dacl.aces[0].inherit_only);
        assert_eq!(dacl.aces[1].sid.as_str(), LOCAL_SYSTEM);
    }

    #[test]
    fn what_wine_reports_for_a_new_folder() {
        // Read back under Wine 8.0 from a folder a program created.
        let d = parse(
            "O:S-1-5-21-0-0-0-1000G:S-1-5-21-0-0-0-513D:(A;OICI;FA;;;SY)\
             (A;OICI;FA;;;S-1-5-21-0-0-0-1000)(A;OICI;0x1200a9;;;WD)",
        )
        .unwrap();
        assert_eq!(d.owner.unwrap().as_str(), "S-1-5-21-0-0-0-1000");
        let dacl = d.dacl.unwrap();
        assert!(!dacl.protected);
        assert_eq!(dacl.aces[2].rights, 0x0012_00A9);
        assert_eq!(dacl.aces[2].sid.to_string(), "Everyone (S-1-1-0)");
    }

    #[test]
    fn codes_flags_conditions_and_null_dacls() {
        let d =
            parse("D:AI(A;CIIOID;GRGX;;;BU)(XA;;FX;;;WD;(WIN://SYSAPPID Contains \"x\"))").unwrap();
        let dacl = d.dacl.unwrap();
        assert!(!dacl.protected);
        assert!(dacl.aces[0].inherit_only && dacl.aces[0].inherited);
        assert_eq!(dacl.aces[0].rights, 0xA000_0000);
        assert_eq!(dacl.aces[1].kind, AceKind::Allow);
        assert_eq!(parse("O:SYD:NO_ACCESS_CONTROL").unwrap().dacl, None);
        assert_eq!(parse("O:SY").unwrap().dacl, None);
        assert_eq!(
            parse("D:P").unwrap().dacl,
            Some(Dacl {
                protected: true,
                aces: vec![]
            })
        );
    }

    #[test]
    fn malformed_strings_are_named() {
        for bad in [
            "X:BA",
            "D:(A;;FA;;;BA",
            "D:(A;;FA;BA)",
            "D:(A;;QQ;;;BA)",
            "D:junk(A;;FA;;;BA)x",
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.sddl, bad, "{e}");
        }
    }
}
