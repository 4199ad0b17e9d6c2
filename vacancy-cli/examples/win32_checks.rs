//! The Windows build's own checks, run under Wine by `scripts/windows test`:
//! the Win32 wrappers against the real calls, and vacancy's decisions about
//! security descriptors on the Windows build (the same decisions' unit tests
//! run on Linux in `vacancy::platform::access`). A program rather than a
//! test target: it is built with vacancyd in one compilation, where a test
//! target would need the standard library compiled again for the target.
//! It lives in vacancy-cli, which links both vacancy and vacancy-win32, so
//! the low crate vacancy-win32 does not import the crate above it. Each check
//! panics on failure, so the program fails. What Wine cannot show
//! is said where it matters: it reports every folder as owned by the user
//! running it, with a DACL made from the Unix mode, whatever was set.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

/// Run with this argument, the program waits (a child process for the
/// process-tree check) and exits.
const WAIT_ARG: &str = "--wait-as-a-child";

#[cfg(windows)]
mod checks {
    use super::WAIT_ARG;
    use vacancy::platform::access::{
        ADMIN_PIPE_SDDL, Exposure, PRIVATE_DIR_SDDL, Trusted, describe, exposures,
    };
    use vacancy::platform::sddl::{self, Sid};
    use vacancy_win32::{fs, pipe, process, security};

    // REC-23, HELD-09: the accepting side, on this build, from the descriptors
    // vacancyd itself sets.
    fn rec_23_held_09_vacancyds_own_descriptors_let_in_only_administrators_and_system() {
        let trusted = Trusted::administrators_and_system();
        assert_eq!(
            exposures(&sddl::parse(PRIVATE_DIR_SDDL).unwrap(), &trusted),
            vec![]
        );
        assert_eq!(
            exposures(&sddl::parse(ADMIN_PIPE_SDDL).unwrap(), &trusted),
            vec![]
        );
        let users = sddl::parse("O:BAD:P(A;OICI;FA;;;BA)(A;OICI;0x1200a9;;;BU)").unwrap();
        assert_eq!(
            describe(&exposures(&users, &trusted)),
            "gives Users (S-1-5-32-545) read and execute access (0x1200a9)"
        );
    }

    // REC-23: a folder created with vacancyd's descriptor, read back through
    // GetNamedSecurityInfoW and its SDDL, judged as the daemon judges it.
    fn rec_23_a_folder_created_with_a_descriptor_reads_back_and_is_judged() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("private");
        security::create_dir(&dir, PRIVATE_DIR_SDDL).unwrap();
        assert!(dir.is_dir());
        let text = security::descriptor_sddl(&dir).unwrap();
        let read = sddl::parse(&text).unwrap();
        let found = exposures(&read, &Trusted::administrators_and_system());
        if process::under_wine() {
            // Wine keeps no owner or DACL a program sets: its user owns it.
            let me = Sid::new(&process::user_sid().unwrap());
            assert_eq!(read.owner.as_ref(), Some(&me), "{text}");
            assert!(found.contains(&Exposure::Owner(me)), "{text}");
        } else {
            assert_eq!(found, vec![], "{text}");
            assert!(read.dacl.unwrap().protected, "{text}");
        }
        // Created already: an error, never a second folder or a changed one.
        let again = security::create_dir(&dir, PRIVATE_DIR_SDDL).unwrap_err();
        assert_eq!(again.kind(), std::io::ErrorKind::AlreadyExists);
        assert!(security::create_dir(&dir.join("x"), "not SDDL").is_err());
    }

    // REC-04/REC-05 the Windows way: the new file replaces the old at once.
    fn replace_file_moves_the_new_record_over_the_old_one() {
        let tmp = tempfile::tempdir().unwrap();
        let (old, new) = (tmp.path().join("record"), tmp.path().join(".record.tmp"));
        std::fs::write(&old, b"old").unwrap();
        std::fs::write(&new, b"new").unwrap();
        fs::replace_file(&new, &old).unwrap();
        assert_eq!(std::fs::read(&old).unwrap(), b"new");
        assert!(!new.exists());
        assert!(fs::replace_file(&new, &old).is_err());
    }

    // HELD-09: the pipe is created with its DACL; a second first instance of the
    // name is refused, so no other process can have taken it first unnoticed.
    fn held_09_the_admin_pipe_is_created_and_its_name_cannot_be_taken_twice() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let name = format!(r"\\.\pipe\vacancy-win32-test-{}", std::process::id());
            let first = pipe::create_server(&name, ADMIN_PIPE_SDDL, true).unwrap();
            let taken = pipe::create_server(&name, ADMIN_PIPE_SDDL, true);
            // Wine 8.0 does not refuse a second FILE_FLAG_FIRST_PIPE_INSTANCE
            // (docs/windows.md lists it as not seen); Windows does.
            if !process::under_wine() {
                assert!(taken.is_err());
            }
            drop(taken);
            let second = pipe::create_server(&name, ADMIN_PIPE_SDDL, false).unwrap();
            let client = tokio::net::windows::named_pipe::ClientOptions::new()
                .open(&name)
                .unwrap();
            first.connect().await.unwrap();
            drop((client, first, second));
            assert!(pipe::create_server(&name, "D:(", true).is_err());
        });
    }

    fn the_process_its_account_and_program_data() {
        assert!(process::user_sid().unwrap().starts_with("S-1-5-"));
        // Wine's programs see the Unix environment; Windows' have no WINEPREFIX.
        assert_eq!(
            process::under_wine(),
            std::env::var_os("WINEPREFIX").is_some()
        );
        let pd = fs::program_data().unwrap();
        assert!(
            pd.to_string_lossy().to_lowercase().ends_with("programdata"),
            "{}",
            pd.display()
        );
    }

    /// Every check, in order, each named as it passes.
    // Issue 35 item 2: GetSystemPowerStatus answers, and vacancy decides
    // from it. Wine reports what its host shows (a machine without a
    // battery here), so this checks the call, not a laptop.
    fn the_power_status_reads_and_is_decided() {
        let status = vacancy_win32::power::system_power_status().unwrap();
        let source =
            vacancy::sample::windows_power_source(status.ac_line_status, status.battery_flag);
        println!("  GetSystemPowerStatus: {status:?} -> {source:?}");
    }

    // Issue 33 item 2: the console session's calls answer, each Ok or a
    // precise error, and vacancy decides from them. Wine is not Windows:
    // what it shows is printed, and checked only where Windows' answer is
    // certain either way.
    fn the_console_session_reads_and_is_decided() {
        use vacancy::presence::windows::{
            ConsoleState, SessionFacts, SessionSettings, WtsConsole, console_state, describe,
            windows_session,
        };
        use vacancy_win32::session;
        let id = session::active_console_session();
        println!("  WTSGetActiveConsoleSessionId: {id:?}");
        let Some(id) = id else {
            // A switch under way: nothing else to ask.
            return;
        };
        let state = session::connect_state(id);
        let user = session::user_name(id);
        let flags = session::session_flags(id);
        println!("  WTSConnectState: {state:?}");
        println!("  WTSUserName: {user:?}");
        println!("  WTSSessionInfoEx SessionFlags: {flags:?}");
        if let Ok(s) = &state {
            assert!((0..=9).contains(s), "WTS_CONNECTSTATE_CLASS {s}");
        }
        if let Ok(f) = &flags {
            assert!([0, 1, -1].contains(f), "SessionFlags {f}");
        }
        // A session that does not exist is an error, never an answer.
        assert!(session::connect_state(0xFFFF_FFF0).is_err());
        if let (Ok(state), Ok(user)) = (state, user) {
            let console = WtsConsole {
                session: Some(id),
                connect_state: state,
                user_name: user,
                session_flags: flags.map_err(|e| e.to_string()),
            };
            let read = console_state(&console);
            let presence = windows_session(
                &SessionFacts {
                    console: read,
                    since_input: None,
                },
                &SessionSettings::default(),
            );
            println!("  {} -> {read:?} -> {presence:?}", describe(&console));
            if !matches!(read, ConsoleState::SignedIn { .. }) {
                assert_ne!(presence, vacancy::engine::OwnerPresence::Present);
            }
        }
    }

    // Issue 33 item 2, OWN-01: the session decision's table, the one the
    // unit tests check on Linux, holds on the Windows build too.
    fn own_01_the_session_decision_table_holds_on_the_windows_build() {
        use vacancy::presence::windows::{decision_table, windows_session};
        let table = decision_table();
        assert_eq!(table.len(), 17);
        for row in table {
            assert_eq!(
                windows_session(&row.facts, &row.settings),
                row.expected,
                "{}",
                row.what
            );
        }
    }

    // Issue 33 item 3: the upstream servers' processes, which GPU pressure
    // leaves out of the owner's load, found through the real Win32 calls: a
    // listener of this process (IPv4 and IPv6), a child it started (a copy of
    // this program, waiting), and the GPU Process Memory counters. Wine 8
    // lists the listeners but names no owner (PID 0), and has no GPU
    // counters: the check says so, and that nothing is then excluded.
    fn gpu_pressure_finds_the_servers_processes_and_reads_or_refuses_gpu_memory() {
        use vacancy_win32::gpu_owners;
        let me = std::process::id();
        let wine = process::under_wine();
        let v4 = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let v4_addr = v4.local_addr().unwrap();
        let owner_of = |addr: std::net::SocketAddr| {
            let listeners = gpu_owners::listening_tcp().unwrap();
            let found = listeners.iter().find(|l| l.local == addr).map(|l| l.pid);
            println!("  GetExtendedTcpTable: {addr} owned by {found:?} (this process is {me})");
            assert!(found.is_some(), "{addr} in {listeners:?}");
            found
        };
        let v4_owner = owner_of(v4_addr);
        match std::net::TcpListener::bind("[::1]:0") {
            Ok(v6) => {
                let v6_owner = owner_of(v6.local_addr().unwrap());
                if !wine {
                    assert_eq!(v6_owner, Some(me));
                }
            }
            Err(e) => println!("  no IPv6 loopback here ({e}): IPv6 not checked"),
        }
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .arg(WAIT_ARG)
            .spawn()
            .unwrap();
        let tree = gpu_owners::processes().unwrap();
        let servers = vacancy::gpu_pressure::server_pids(&[v4_addr]);
        let other_port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let none = vacancy::gpu_pressure::server_pids(&[other_port]);
        let (child_started, me_started) =
            (gpu_owners::started(child.id()), gpu_owners::started(me));
        let _ = child.kill();
        let _ = child.wait();
        println!(
            "  server_pids({v4_addr}) = {servers:?} (this process {me}, its child {})",
            child.id()
        );
        assert!(
            tree.iter().any(|p| p.pid == child.id() && p.parent == me),
            "the child in the Toolhelp32 snapshot: {tree:?}"
        );
        assert!(child_started >= me_started && me_started.is_some());
        assert_eq!(none, Vec::<u32>::new());
        if v4_owner == Some(0) {
            // Wine: no owner is named, so nothing is excluded and borrowed
            // work's GPU use would count as the owner's (refusing, not lending).
            assert!(wine, "Windows names every listener's owner");
            assert_eq!(servers, Vec::<u32>::new());
        } else {
            assert_eq!(v4_owner, Some(me));
            assert!(servers.contains(&me), "{servers:?}");
            assert!(servers.contains(&child.id()), "the child: {servers:?}");
        }
        match gpu_owners::gpu_process_dedicated_memory() {
            Ok(instances) => {
                println!("  GPU Process Memory: {} instances", instances.len());
                assert!(!wine, "Wine has GPU counters now: {instances:?}");
            }
            Err(e) => {
                println!("  GPU Process Memory: {e}");
                assert!(wine, "Windows 10 1709+ has the counters: {e}");
            }
        }
    }

    pub fn run() {
        let checks: [(&str, fn()); 9] = [
            (
                "rec_23_held_09_vacancyds_own_descriptors_let_in_only_administrators_and_system",
                rec_23_held_09_vacancyds_own_descriptors_let_in_only_administrators_and_system,
            ),
            (
                "rec_23_a_folder_created_with_a_descriptor_reads_back_and_is_judged",
                rec_23_a_folder_created_with_a_descriptor_reads_back_and_is_judged,
            ),
            (
                "replace_file_moves_the_new_record_over_the_old_one",
                replace_file_moves_the_new_record_over_the_old_one,
            ),
            (
                "held_09_the_admin_pipe_is_created_and_its_name_cannot_be_taken_twice",
                held_09_the_admin_pipe_is_created_and_its_name_cannot_be_taken_twice,
            ),
            (
                "the_process_its_account_and_program_data",
                the_process_its_account_and_program_data,
            ),
            (
                "the_power_status_reads_and_is_decided",
                the_power_status_reads_and_is_decided,
            ),
            (
                "the_console_session_reads_and_is_decided",
                the_console_session_reads_and_is_decided,
            ),
            (
                "own_01_the_session_decision_table_holds_on_the_windows_build",
                own_01_the_session_decision_table_holds_on_the_windows_build,
            ),
            (
                "gpu_pressure_finds_the_servers_processes_and_reads_or_refuses_gpu_memory",
                gpu_pressure_finds_the_servers_processes_and_reads_or_refuses_gpu_memory,
            ),
        ];
        for (name, check) in checks {
            check();
            println!("check {name} ... ok");
        }
    }
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some(WAIT_ARG) {
        std::thread::sleep(std::time::Duration::from_secs(30));
        return;
    }
    #[cfg(windows)]
    checks::run();
    #[cfg(not(windows))]
    println!("the Windows build's checks: nothing to check on this system");
}
