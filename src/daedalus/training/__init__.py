"""Training-run supervision on the host: the watchdog (supervisor.py) and its parts, one module per job.

supervisor.py      one segment: start or re-attach to an incarnation, sample, stop gracefully, report
trainer_keeper.py  the keeper a trainer runs under, so it outlives its watchdog (`trainer.json`, `exit.json`)
incarnation.py     an incarnation's state and artifact dirs and the lock that keeps two watchdogs off one trainer
memory.py          memory readings (host, process tree, cgroup, NVML) and the leak slope fitted to them
memory_events.py   the kernel's memory notifications (cgroup thresholds, PSI triggers)
waker.py           the sleep between samples, cut short by those notifications
stop_rule.py       threshold for N samples, or a projected crossing
curve.py           the memory curve on disk
progress.py        the trainer's steps, throughput and ETA
checkpoints.py     complete checkpoints, those there before the run, pruning
deaths.py          a death's class, its OOM evidence, the evidence kept
hunt.py            the hunting ticket a run opens after its counted deaths, with the deaths side by side
host_report.py     what on the host may kill a trainer (earlyoom, oomd, swap, cron)
checkpoint_eval.py a checkpoint measured, confined as a gate is
gpu_trainer.py     a small PyTorch trainer keeping the watchdog's protocol (the GPU lane's and train8's run)
drafter_eval.py    its checkpoints judged as speculative-decoding drafters
"""
