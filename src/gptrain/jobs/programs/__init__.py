"""What users bring to run as a job: their code (a folder or a git repository, snapshotted),
their job files (gptrain's job.yaml, a cloud service's own), and the hosted service's fixed
paths in their programs' arguments."""
