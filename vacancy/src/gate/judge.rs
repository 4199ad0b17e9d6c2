//! Judging the probe's answer: the `<think>` block and the expected word.

/// What is left of a chat answer once its reasoning is taken out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stripped {
    /// The answer proper: the text outside every `<think>…</think>` block.
    Answer(String),
    /// A `<think>` block was opened and never closed: the model was still
    /// reasoning when its token room ran out, so it gave no answer yet.
    Unclosed,
}

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// Takes every `<think>…</think>` block out of `text` (tags matched without
/// regard to ASCII case). A `</think>` with no `<think>` before it ends a block
/// that the chat template opened in the prompt, so everything before it is
/// reasoning too. A `<think>` that is never closed gives [`Stripped::Unclosed`].
///
/// # Behavior
/// - GATE-04: the chat retry leaves room for a reasoning model's `<think>`
///   block; the block is removed before the answer is judged.
pub fn strip_think(text: &str) -> Stripped {
    let lower = text.to_ascii_lowercase();
    let mut out = String::new();
    let mut pos = 0;
    // A close tag before any open tag: the template opened the block.
    if let Some(close) = lower.find(CLOSE)
        && lower.find(OPEN).is_none_or(|open| close < open)
    {
        pos = close + CLOSE.len();
    }
    loop {
        match lower[pos..].find(OPEN) {
            None => {
                out.push_str(&text[pos..]);
                return Stripped::Answer(out.trim().to_string());
            }
            Some(rel) => {
                out.push_str(&text[pos..pos + rel]);
                let body = pos + rel + OPEN.len();
                match lower[body..].find(CLOSE) {
                    None => return Stripped::Unclosed,
                    Some(end) => pos = body + end + CLOSE.len(),
                }
            }
        }
    }
}

/// Whether `answer` gives `expected`: `expected` occurs in it as a whole word
/// (not inside a longer word: "Parisian" is not "Paris"), compared without
/// regard to case. Punctuation, quotes, markdown and surrounding words do not
/// matter: " Paris.", "**PARIS**" and "the city of Paris" all give "Paris".
///
/// # Behavior
/// - GATE-02: the known answer to "The capital of France is" is "Paris".
///   Reading (the rules are silent on matching; flagged to the spec owner):
///   case-insensitive, whole word, anywhere in the bounded answer.
pub fn gives_expected(answer: &str, expected: &str) -> bool {
    let expected: Vec<char> = expected.chars().flat_map(char::to_lowercase).collect();
    if expected.is_empty() {
        return false;
    }
    let hay: Vec<char> = answer.chars().flat_map(char::to_lowercase).collect();
    if hay.len() < expected.len() {
        return false;
    }
    (0..=hay.len() - expected.len()).any(|i| {
        hay[i..i + expected.len()] == expected[..]
            && (i == 0 || !hay[i - 1].is_alphanumeric())
            && hay
                .get(i + expected.len())
                .is_none_or(|c| !c.is_alphanumeric())
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    // GATE-02: the greedy continuation " Paris." is the known answer.
    #[test]
    fn gate_02_plain_continuation_passes() {
        assert!(gives_expected(" Paris.", "Paris"));
        assert!(gives_expected("Paris", "Paris"));
        assert!(gives_expected(" Paris, and its largest city.", "Paris"));
    }

    // GATE-02 reading: case does not matter.
    #[test]
    fn gate_02_case_insensitive() {
        assert!(gives_expected(" PARIS", "Paris"));
        assert!(gives_expected(" paris!", "Paris"));
    }

    // GATE-02 reading: punctuation, quotes, markdown around the word are fine.
    #[test]
    fn gate_02_punctuation_and_markdown() {
        for a in [
            "\"Paris\"",
            "**Paris**",
            "(Paris)",
            "Paris's",
            "'Paris'.",
            "\n\nParis\n",
        ] {
            assert!(gives_expected(a, "Paris"), "{a:?}");
        }
    }

    // GATE-02 reading: anywhere in the (bounded) answer, as a chat model says it.
    #[test]
    fn gate_02_anywhere_in_answer() {
        assert!(gives_expected(
            "The capital of France is **Paris**.",
            "Paris"
        ));
        assert!(gives_expected(" the city of Paris.", "Paris"));
    }

    // GATE-02 reading: a whole word only, never part of a longer word.
    #[test]
    fn gate_02_whole_word_only() {
        for a in [
            " Parisian",
            "Parisienne",
            "comparison",
            "xparis",
            "Paris2",
            "",
        ] {
            assert!(!gives_expected(a, "Paris"), "{a:?}");
        }
    }

    // GATE-05: the real wrong answer of gemma-3-270m, and garbage, are wrong.
    #[test]
    fn gate_05_wrong_answers() {
        assert!(!gives_expected(
            " the capital of the country of France. It is the largest city in France.",
            "Paris"
        ));
        assert!(!gives_expected("q#v8 ]]kz P a r i s", "Paris"));
        assert!(!gives_expected(" Lyon.", "Paris"));
    }

    #[test]
    fn empty_expected_never_matches() {
        assert!(!gives_expected("anything", ""));
    }

    // GATE-04: the think block is removed before judging.
    #[test]
    fn gate_04_think_block_is_stripped() {
        assert_eq!(
            strip_think("<think>France... Lyon? no, Paris</think>\n\nParis."),
            Stripped::Answer("Paris.".into())
        );
        assert_eq!(
            strip_think("<THINK>the answer is Paris</Think> Lyon"),
            Stripped::Answer("Lyon".into())
        );
        // Reasoning that mentions Paris does not count: only the answer does.
        let Stripped::Answer(a) = strip_think("<think>Paris</think>Lyon") else {
            panic!("closed block")
        };
        assert!(!gives_expected(&a, "Paris"));
    }

    #[test]
    fn gate_04_several_blocks_and_text_between() {
        assert_eq!(
            strip_think("A <think>x</think>B<think>y</think> C"),
            Stripped::Answer("A B C".into())
        );
    }

    // GATE-04: a block the chat template opened in the prompt (only the close
    // tag is generated).
    #[test]
    fn gate_04_template_opened_block() {
        assert_eq!(
            strip_think("reasoning about Lyon</think>\nParis"),
            Stripped::Answer("Paris".into())
        );
    }

    // GATE-04/GATE-09: reasoning cut off by the token limit is no answer.
    #[test]
    fn gate_04_unclosed_block_is_no_answer() {
        assert_eq!(
            strip_think("<think>France is a country in"),
            Stripped::Unclosed
        );
        assert_eq!(
            strip_think("Hm <think>a</think> b <think>c"),
            Stripped::Unclosed
        );
    }

    #[test]
    fn no_think_block_is_the_answer_trimmed() {
        assert_eq!(strip_think("  Paris \n"), Stripped::Answer("Paris".into()));
        assert_eq!(strip_think(""), Stripped::Answer(String::new()));
    }
}
