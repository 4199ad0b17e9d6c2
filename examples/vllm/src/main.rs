//! `vacancyd-vllm`: vacancyd with one more adapter kind, `vllm`. Every
//! subcommand is vacancyd's (`run`, `check-config`, `status`, ...).

fn main() -> std::process::ExitCode {
    vacancy_cli::Vacancyd::with_builtin_adapters()
        .adapter(vacancy_vllm::NAME, vacancy_vllm::VllmFactory)
        .main()
}
