//! A virtual X display (Debian's `xvfb`) for the Windows tray's tests under
//! Wine: Wine draws its system tray and menus there. Screenshots are read
//! with `xwd` (Debian's `x11-apps`) and kept as PNG; clicks and keys go in
//! with `xdotool`. Nothing is drawn on a real screen.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::SupportError;

/// The Debian packages these need (scripts/windows installs them).
pub const DISPLAY_DEBIAN_PACKAGES: &str = "xvfb x11-apps xdotool";

/// An `Xvfb` server on a free display number, stopped on drop.
#[derive(Debug)]
pub struct VirtualDisplay {
    child: Child,
    name: String,
}

fn missing(binary: &str) -> SupportError {
    SupportError::Invalid {
        what: binary.to_owned(),
        message: format!(
            "{binary} is missing; install the Debian packages {DISPLAY_DEBIAN_PACKAGES} (scripts/windows toolchain does)"
        ),
    }
}

fn run(what: &str, cmd: &mut Command) -> Result<Vec<u8>, SupportError> {
    let out = cmd.output().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            missing(what)
        } else {
            SupportError::io(format!("run {what}"), e)
        }
    })?;
    if !out.status.success() {
        return Err(SupportError::Command {
            what: format!("{cmd:?}"),
            status: out.status.to_string(),
            tail: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(out.stdout)
}

impl VirtualDisplay {
    /// An 800×600 display, 24 bits a pixel, ready for clients.
    ///
    /// # Errors
    ///
    /// When `Xvfb` is missing or does not come up within 10 s.
    pub fn start() -> Result<VirtualDisplay, SupportError> {
        let first = 90 + std::process::id() % 100;
        let number = (first..first + 100)
            .find(|n| !Path::new(&format!("/tmp/.X{n}-lock")).exists())
            .ok_or_else(|| SupportError::Invalid {
                what: "display".to_owned(),
                message: "no free X display number".to_owned(),
            })?;
        let name = format!(":{number}");
        let child = Command::new("Xvfb")
            .args([&name, "-screen", "0", "800x600x24", "-nolisten", "tcp"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    missing("Xvfb")
                } else {
                    SupportError::io("start Xvfb", e)
                }
            })?;
        let display = VirtualDisplay { child, name };
        let socket = PathBuf::from(format!("/tmp/.X11-unix/X{number}"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            if Instant::now() > deadline {
                return Err(SupportError::Timeout {
                    what: format!("Xvfb {} to listen", display.name),
                    after: Duration::from_secs(10),
                    tail: String::new(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(display)
    }

    /// Its name, for `DISPLAY`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `xdotool ARGS` on this display; its output.
    ///
    /// # Errors
    ///
    /// When xdotool is missing or fails.
    pub fn xdotool(&self, args: &[&str]) -> Result<String, SupportError> {
        let out = run(
            "xdotool",
            Command::new("xdotool")
                .args(args)
                .env("DISPLAY", &self.name),
        )?;
        Ok(String::from_utf8_lossy(&out).trim().to_owned())
    }

    /// The visible windows whose name matches `pattern` (a regular
    /// expression, as xdotool takes it).
    ///
    /// # Errors
    ///
    /// When xdotool is missing.
    pub fn windows(&self, pattern: &str) -> Result<Vec<String>, SupportError> {
        // xdotool exits 1 when nothing matches.
        let out = Command::new("xdotool")
            .args(["search", "--onlyvisible", "--name", pattern])
            .env("DISPLAY", &self.name)
            .output()
            .map_err(|_| missing("xdotool"))?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect())
    }

    /// The screen's top-left `width`×`height` pixels as a PNG at `path`.
    ///
    /// # Errors
    ///
    /// When xwd fails or its image is not one this reads (4 bytes a pixel).
    pub fn screenshot(&self, path: &Path, width: u32, height: u32) -> Result<(), SupportError> {
        let xwd = self.capture_root()?;
        let (w, h, rgb) = decode_xwd(&xwd)?;
        let (cw, ch) = (width.min(w), height.min(h));
        let mut cropped = Vec::with_capacity((cw * ch * 3) as usize);
        for y in 0..ch {
            let start = ((y * w) * 3) as usize;
            cropped.extend_from_slice(&rgb[start..start + (cw * 3) as usize]);
        }
        let file = std::fs::File::create(path)
            .map_err(|e| SupportError::io(format!("create {}", path.display()), e))?;
        let mut encoder = png::Encoder::new(std::io::BufWriter::new(file), cw, ch);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let failed = |e: png::EncodingError| SupportError::Invalid {
            what: format!("PNG {}", path.display()),
            message: e.to_string(),
        };
        let mut writer = encoder.write_header().map_err(failed)?;
        writer.write_image_data(&cropped).map_err(failed)?;
        writer.finish().map_err(failed)
    }

    /// The whole screen as `xwd` writes it. A capture taken while a window
    /// is being mapped (a menu opening) can fail with `BadMatch` from
    /// `X_GetImage` (CI: the tray test's menu); it is taken again, at most
    /// twice more.
    fn capture_root(&self) -> Result<Vec<u8>, SupportError> {
        let mut attempts = 0;
        loop {
            let taken = run(
                "xwd",
                Command::new("xwd")
                    .args(["-root", "-silent"])
                    .env("DISPLAY", &self.name),
            );
            attempts += 1;
            match taken {
                Err(SupportError::Command { tail, .. })
                    if attempts < 3 && tail.contains("BadMatch") =>
                {
                    std::thread::sleep(Duration::from_millis(100));
                }
                other => return other,
            }
        }
    }
}

impl Drop for VirtualDisplay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An XWD dump of a TrueColor screen as (width, height, RGB bytes).
fn decode_xwd(data: &[u8]) -> Result<(u32, u32, Vec<u8>), SupportError> {
    let bad = |message: &str| SupportError::Invalid {
        what: "xwd image".to_owned(),
        message: message.to_owned(),
    };
    let field = |i: usize| -> Result<u32, SupportError> {
        data.get(i * 4..i * 4 + 4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or_else(|| bad("shorter than its header"))
    };
    let (header, width, height) = (field(0)?, field(4)?, field(5)?);
    let (byte_order, bytes_per_line, colors) = (field(7)?, field(12)?, field(19)?);
    // Xvfb's 24-bit screen says 24 bits a pixel but keeps each in 32.
    if width == 0 || bytes_per_line / width != 4 {
        return Err(bad(&format!(
            "{bytes_per_line} bytes a line for {width} pixels, not 4 a pixel"
        )));
    }
    let start = header as usize + colors as usize * 12;
    let mut rgb = Vec::with_capacity((width * height * 3) as usize);
    for y in 0..height as usize {
        let row = start + y * bytes_per_line as usize;
        for x in 0..width as usize {
            let p = data
                .get(row + x * 4..row + x * 4 + 4)
                .ok_or_else(|| bad("shorter than its pixels"))?;
            // LSBFirst (0): B, G, R, pad in memory; MSBFirst: pad, R, G, B.
            let (r, g, b) = if byte_order == 0 {
                (p[2], p[1], p[0])
            } else {
                (p[1], p[2], p[3])
            };
            rgb.extend_from_slice(&[r, g, b]);
        }
    }
    Ok((width, height, rgb))
}
