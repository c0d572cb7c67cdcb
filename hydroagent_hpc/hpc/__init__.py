"""HPC execution: pools of workers (serial, processes; MPI and Slurm with the HPC issue)."""
