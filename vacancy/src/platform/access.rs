//! Who a Windows folder lets in, judged from its descriptor as data
//! (REC-23, REC-24, HELD-09's pipe).
//!
//! Pure functions over [`Descriptor`]s: the Windows side of the seam reads a
//! real folder's descriptor and asks here, and the tests of every build ask
//! the same questions of descriptors written as SDDL, since Wine does not
//! keep the owner or DACL a program sets and so can show only refusals.

use std::fmt;

use super::sddl::{ADMINISTRATORS, AceKind, Descriptor, LOCAL_SYSTEM, Sid};

/// The descriptor vacancyd gives every folder it creates on Windows, and
/// the only kind it accepts: owned by Administrators, a protected DACL (the
/// parent's entries do not flow in) that lets in Administrators and
/// LocalSystem, passed on to the files and folders created inside.
pub const PRIVATE_DIR_SDDL: &str = "O:BAD:P(A;OICI;FA;;;BA)(A;OICI;FA;;;SY)";

/// The DACL of the local administration pipe (HELD-09): Administrators and
/// LocalSystem, nobody else.
pub const ADMIN_PIPE_SDDL: &str = "D:P(A;;GA;;;BA)(A;;GA;;;SY)";

/// `FILE_ATTRIBUTE_REPARSE_POINT`: a junction, a symbolic link or another
/// reparse point, which could send a path anywhere (REC-24).
pub const FILE_ATTRIBUTE_REPARSE_POINT: u32 = 0x400;

/// Whether a file's attributes mark it as a reparse point.
pub fn is_reparse_point(attributes: u32) -> bool {
    attributes & FILE_ATTRIBUTE_REPARSE_POINT != 0
}

/// The accounts a private folder may let in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trusted {
    sids: Vec<Sid>,
}

impl Trusted {
    /// Administrators and LocalSystem: the seed's accounts (REC-23).
    pub fn administrators_and_system() -> Trusted {
        Trusted {
            sids: vec![Sid::new(ADMINISTRATORS), Sid::new(LOCAL_SYSTEM)],
        }
    }

    /// These accounts and `sid` as well (only for running under Wine,
    /// where no folder can be made to show the seed's accounts alone).
    pub fn and(mut self, sid: Sid) -> Trusted {
        if !self.sids.contains(&sid) {
            self.sids.push(sid);
        }
        self
    }

    /// Whether `sid` is one of them.
    pub fn contains(&self, sid: &Sid) -> bool {
        self.sids.contains(sid)
    }
}

impl fmt::Display for Trusted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<String> = self.sids.iter().map(Sid::to_string).collect();
        match names.split_last() {
            Some((last, [])) => f.write_str(last),
            Some((last, rest)) => write!(f, "{} and {last}", rest.join(", ")),
            None => f.write_str("nobody"),
        }
    }
}

/// One way a folder lets in an account it should not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exposure {
    /// A NULL DACL: every account has full access.
    NoDacl,
    /// Owned by another account, which can always change the permissions.
    Owner(Sid),
    /// An entry allows another account in.
    Access {
        /// The account.
        sid: Sid,
        /// What it may do.
        rights: u32,
        /// The entry only passes to what is created inside.
        inherit_only: bool,
    },
}

impl fmt::Display for Exposure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exposure::NoDacl => f.write_str("has no DACL, so every account has full access"),
            Exposure::Owner(sid) => write!(
                f,
                "is owned by {sid}, who can always change its permissions"
            ),
            Exposure::Access {
                sid,
                rights,
                inherit_only,
            } => {
                write!(
                    f,
                    "gives {sid} {} access ({rights:#x})",
                    rights_in_words(*rights)
                )?;
                if *inherit_only {
                    f.write_str(" to everything created inside it")?;
                }
                Ok(())
            }
        }
    }
}

/// Every way `descriptor` lets in an account that is not `trusted`, in
/// order: the owner first, then each allowing entry (deny entries only take
/// access away). Empty when the folder is private to `trusted` (REC-23).
/// An owner absent from the descriptor is not judged (a pipe's, say).
pub fn exposures(descriptor: &Descriptor, trusted: &Trusted) -> Vec<Exposure> {
    let mut found = Vec::new();
    if let Some(owner) = &descriptor.owner
        && !trusted.contains(owner)
    {
        found.push(Exposure::Owner(owner.clone()));
    }
    let Some(dacl) = &descriptor.dacl else {
        found.push(Exposure::NoDacl);
        return found;
    };
    for ace in &dacl.aces {
        if ace.kind == AceKind::Allow && ace.rights != 0 && !trusted.contains(&ace.sid) {
            found.push(Exposure::Access {
                sid: ace.sid.clone(),
                rights: ace.rights,
                inherit_only: ace.inherit_only,
            });
        }
    }
    found
}

/// What `exposures` found, as one clause: `gives Everyone (S-1-1-0) read
/// and execute access (0x1200a9); is owned by ...`.
pub fn describe(found: &[Exposure]) -> String {
    found
        .iter()
        .map(Exposure::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// An access mask in words: `read and execute` for `0x1200a9`.
pub fn rights_in_words(mask: u32) -> String {
    // Generic rights, as a file or folder maps them.
    let mut m = mask;
    for (generic, specific) in [
        (0x1000_0000, 0x001F_01FF),
        (0x8000_0000, 0x0012_0089),
        (0x4000_0000, 0x0012_0116),
        (0x2000_0000, 0x0012_00A0),
    ] {
        if m & generic != 0 {
            m = (m & !generic) | specific;
        }
    }
    let words = if m & 0x001F_01FF == 0x001F_01FF {
        vec!["full control"]
    } else {
        [
            (0x0000_0001, "read"),
            (0x0000_0006, "write"),
            (0x0000_0020, "execute"),
            (0x0001_0040, "delete"),
            (0x0004_0000, "change-permissions"),
            (0x0008_0000, "take-ownership"),
        ]
        .iter()
        .filter(|(bits, _)| m & bits != 0)
        .map(|(_, word)| *word)
        .collect()
    };
    match words.split_last() {
        None => "special".to_owned(),
        Some((last, [])) => (*last).to_owned(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
    }
}

/// Whether the Windows path `dir` is `base` or inside it, compared as
/// Windows compares names: without regard to case, `\` and `/` alike, a
/// `\\?\` prefix ignored. A path with `..` left in it is never inside (the
/// caller resolves them first). Pure over strings, so every build tests it.
pub fn windows_path_inside(dir: &str, base: &str) -> bool {
    let parts = |p: &str| -> Option<Vec<String>> {
        let p = p.strip_prefix(r"\\?\").unwrap_or(p);
        let mut out = Vec::new();
        for c in p.split(['\\', '/']) {
            match c {
                "" | "." => {}
                ".." => return None,
                c => out.push(c.to_lowercase()),
            }
        }
        Some(out)
    };
    match (parts(dir), parts(base)) {
        (Some(d), Some(b)) => !b.is_empty() && d.starts_with(&b),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::platform::sddl::parse;

    fn judge(sddl: &str) -> Vec<Exposure> {
        exposures(&parse(sddl).unwrap(), &Trusted::administrators_and_system())
    }

    // REC-23: the accepting side, from descriptors as Windows writes them.
    #[test]
    fn rec_23_a_folder_of_administrators_and_system_is_private() {
        assert_eq!(judge(PRIVATE_DIR_SDDL), vec![]);
        // Owned by LocalSystem, entries by SID, an inherit-only entry of
        // theirs, and a deny entry for Everyone: still private.
        assert_eq!(
            judge("O:SYD:PAI(A;OICIIO;GA;;;S-1-5-18)(A;;0x1f01ff;;;S-1-5-32-544)(D;;FA;;;WD)"),
            vec![]
        );
        // A protected DACL with no entry at all lets nobody in.
        assert_eq!(judge("O:BAD:P"), vec![]);
    }

    // REC-23: the refusing side names the account and its access.
    #[test]
    fn rec_23_other_owners_and_other_accounts_are_named() {
        let found = judge(
            "O:S-1-5-21-1-2-3-1001D:AI(A;OICI;FA;;;SY)(A;OICI;FA;;;BA)\
             (A;OICIID;0x1200a9;;;BU)(A;OICIIO;GA;;;CO)",
        );
        assert_eq!(
            describe(&found),
            "is owned by S-1-5-21-1-2-3-1001, who can always change its permissions; \
             gives Users (S-1-5-32-545) read and execute access (0x1200a9); \
             gives CREATOR OWNER (S-1-3-0) full control access (0x10000000) to everything \
             created inside it"
        );
        assert_eq!(judge("O:BAD:NO_ACCESS_CONTROL"), vec![Exposure::NoDacl]);
        // What Wine 8.0 reports for a folder a program created: its user
        // owns it and Everyone may read it.
        let wine = judge(
            "O:S-1-5-21-0-0-0-1000G:S-1-5-21-0-0-0-513D:(A;OICI;FA;;;SY)\
             (A;OICI;FA;;;S-1-5-21-0-0-0-1000)(A;OICI;0x1200a9;;;WD)",
        );
        assert_eq!(wine.len(), 3, "{wine:?}");
        assert!(describe(&wine).contains("gives Everyone (S-1-1-0) read and execute access"));
        // Trusting the running account (the Wine test mode) leaves Everyone.
        let trusted = Trusted::administrators_and_system().and(Sid::new("S-1-5-21-0-0-0-1000"));
        let d = parse("O:S-1-5-21-0-0-0-1000D:(A;OICI;FA;;;SY)(A;OICI;FA;;;S-1-5-21-0-0-0-1000)")
            .unwrap();
        assert_eq!(exposures(&d, &trusted), vec![]);
    }

    // HELD-09: the pipe's own DACL admits exactly the seed's accounts.
    #[test]
    fn held_09_the_admin_pipe_admits_only_administrators_and_system() {
        let d = parse(ADMIN_PIPE_SDDL).unwrap();
        assert!(d.dacl.as_ref().unwrap().protected);
        assert_eq!(exposures(&d, &Trusted::administrators_and_system()), vec![]);
        let only_system = Trusted {
            sids: vec![Sid::new(LOCAL_SYSTEM)],
        };
        assert_eq!(exposures(&d, &only_system).len(), 1);
    }

    // REC-24: inside ProgramData\vacancyd, compared as Windows does.
    #[test]
    fn rec_24_inside_the_base_as_windows_compares_paths() {
        let base = r"C:\ProgramData\vacancyd";
        assert!(windows_path_inside(
            r"C:\ProgramData\vacancyd\admission",
            base
        ));
        assert!(windows_path_inside(
            r"c:\programdata\VACANCYD\admission\",
            base
        ));
        assert!(windows_path_inside(r"\\?\C:\ProgramData\vacancyd\x", base));
        assert!(windows_path_inside("C:/ProgramData/vacancyd/x", base));
        assert!(windows_path_inside(base, base));
        assert!(!windows_path_inside(
            r"C:\ProgramData\vacancyd-other\x",
            base
        ));
        assert!(!windows_path_inside(r"C:\ProgramData\vacancyd\..\x", base));
        assert!(!windows_path_inside(r"D:\ProgramData\vacancyd\x", base));
        assert!(!windows_path_inside(
            r"C:\Users\me\vacancyd.admission",
            base
        ));
        assert!(is_reparse_point(0x410) && !is_reparse_point(0x10));
    }

    #[test]
    fn access_masks_in_words() {
        assert_eq!(rights_in_words(0x001F_01FF), "full control");
        assert_eq!(rights_in_words(0x0012_0089), "read");
        assert_eq!(rights_in_words(0x4000_0000), "write");
        assert_eq!(rights_in_words(0x0012_00A9), "read and execute");
        assert_eq!(
            rights_in_words(0x0005_0047),
            "read, write, delete and change-permissions"
        );
        assert_eq!(rights_in_words(0x0000_0100), "special");
    }
}
