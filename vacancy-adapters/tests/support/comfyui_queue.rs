//! A generated ComfyUI `GET /queue` reply of any size, produced chunk by
//! chunk so that the generator itself holds about one chunk and one item.
//!
//! Shared by `tests/comfyui_stream_memory.rs` and
//! `benches/comfyui_queue_scan.rs` (each includes it with `#[path]`).

/// The prompt ID of item `i`, UUID-shaped like ComfyUI's.
pub fn prompt_id(i: u64) -> String {
    format!("{:08x}-0000-4000-8000-{:012x}", i >> 16, i)
}

/// A realistic text prompt with the escapes json.dumps writes.
fn prompt_text(i: u64) -> String {
    let mut text = String::with_capacity(3200);
    while text.len() < 3000 {
        text.push_str(
            "masterpiece, best quality, a \\\"cozy\\\" caf\\u00e9 at dusk, volumetric light,\\n\
             (detailed:1.2), 35mm, bokeh \\ud83c\\udf19, ",
        );
    }
    text.push_str(&format!("variation {i}"));
    text
}

/// One queue item: `[number, prompt_id, workflow, extra_data, outputs]`.
fn item(number: u64, id: &str) -> String {
    let seed = number.wrapping_mul(6_364_136_223_846_793_005) >> 11;
    let text = prompt_text(number);
    format!(
        r#"[{number}, "{id}", {{"3": {{"inputs": {{"seed": {seed}, "steps": 30, "cfg": 7.5, "sampler_name": "dpmpp_2m", "scheduler": "karras", "denoise": 1.0, "model": ["4", 0], "positive": ["6", 0], "negative": ["7", 0], "latent_image": ["5", 0]}}, "class_type": "KSampler", "_meta": {{"title": "KSampler"}}}}, "4": {{"inputs": {{"ckpt_name": "sd_xl_base_1.0.safetensors"}}, "class_type": "CheckpointLoaderSimple"}}, "5": {{"inputs": {{"width": 1024, "height": 1024, "batch_size": 1}}, "class_type": "EmptyLatentImage"}}, "6": {{"inputs": {{"text": "{text}", "clip": ["4", 1]}}, "class_type": "CLIPTextEncode"}}, "7": {{"inputs": {{"text": "lowres, bad anatomy, \"watermark\", -1e-3", "clip": ["4", 1]}}, "class_type": "CLIPTextEncode"}}, "8": {{"inputs": {{"samples": ["3", 0], "vae": ["4", 2]}}, "class_type": "VAEDecode"}}, "9": {{"inputs": {{"filename_prefix": "ComfyUI", "images": ["8", 0]}}, "class_type": "SaveImage"}}}}, {{"client_id": "c0ffee00-{number:04}", "create_time": 1795960781181, "extra_pnginfo": {{"workflow": {{"nodes": [{{"id": 3, "pos": [863.0, 186.5], "flags": {{}}, "mode": 0}}], "links": [[1, 4, 0, 3, 0, "MODEL"]], "version": 0.4, "extra": null}}}}}}, ["9"]]"#
    )
}

/// A `GET /queue` reply of at least `size` bytes: one running item, then
/// pending items, the last of which is `last_id`.
pub struct QueueReply {
    size: usize,
    chunk: usize,
    buf: Vec<u8>,
    start: usize,
    pushed: usize,
    items: u64,
    phase: u8,
    last_id: String,
}

impl QueueReply {
    /// A reply of about `size` bytes, handed out in `chunk`-byte chunks.
    pub fn new(size: usize, chunk: usize, last_id: &str) -> Self {
        QueueReply {
            size,
            chunk,
            buf: Vec::with_capacity(chunk + 16 * 1024),
            start: 0,
            pushed: 0,
            items: 0,
            phase: 0,
            last_id: last_id.to_owned(),
        }
    }

    fn push(&mut self, s: &str) {
        self.buf.extend_from_slice(s.as_bytes());
        self.pushed += s.len();
    }

    fn push_more(&mut self) {
        match self.phase {
            0 => {
                let running = item(0, &prompt_id(0));
                self.push(r#"{"queue_running": ["#);
                self.push(&running);
                self.push(r#"], "queue_pending": ["#);
                self.items = 1;
                self.phase = 1;
            }
            1 => {
                let n = self.items;
                self.items += 1;
                if n > 1 {
                    self.push(", ");
                }
                if self.pushed < self.size {
                    let it = item(n, &prompt_id(n));
                    self.push(&it);
                } else {
                    let it = item(n, &self.last_id.clone());
                    self.push(&it);
                    self.push("]}");
                    self.phase = 2;
                }
            }
            _ => {}
        }
    }

    /// The next chunk, `None` after the last.
    pub fn next_chunk(&mut self) -> Option<&[u8]> {
        self.buf.drain(..self.start);
        self.start = 0;
        while self.buf.len() < self.chunk && self.phase < 2 {
            self.push_more();
        }
        if self.buf.is_empty() {
            return None;
        }
        self.start = self.chunk.min(self.buf.len());
        Some(&self.buf[..self.start])
    }

    /// The whole reply in one buffer.
    pub fn collect(mut self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.size + 64 * 1024);
        while let Some(chunk) = self.next_chunk() {
            out.extend_from_slice(chunk);
        }
        out
    }
}
