"""The machine line every Python bench prints first: the CPU, its logical CPUs, the load, and
the kernel level (ISA) the tessel binary runs at there (from `tessel --version`)."""
import os
import subprocess
import sys


def machine_line(tessel):
    with open("/proc/cpuinfo") as f:
        model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "?")
    version = subprocess.run([tessel, "--version"], capture_output=True, text=True).stdout
    isa = next((l.split(":", 1)[1].strip() for l in version.splitlines()
                if l.startswith("isa:")), "unknown")
    return (f"CPU: {model}, {os.cpu_count()} logical CPUs, load average "
            f"{os.getloadavg()[0]:.1f}; isa: {isa}")


if __name__ == "__main__":  # for the shell benches: python3 bench/machine.py TESSEL
    print(machine_line(sys.argv[1]))
