"""The engines that run jobs, each behind the Scheduler protocol (jobs/schedulers.py): local
(a detached supervisor and torchrun on this machine), slurm, kubernetes and ray. What each one
is and allows is declared once, in jobs/engines/table.py; the job core reaches an engine only
through that table."""
