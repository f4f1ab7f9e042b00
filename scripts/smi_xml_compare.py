#!/usr/bin/env python3
"""NVML as Lockstep reads it beside `nvidia-smi -q -x`, field by field.

scripts/gpu-check runs it on a lent GPU machine (step 6):

    nvidia-smi -q -x > smi.xml
    lockstep top --json --once > top.json
    scripts/smi_xml_compare.py --xml smi.xml --top top.json

Only the readings that do not move between two readings a second apart are compared, and
only those Lockstep reads: the GPU's identity, its memory, its power limit, its highest SM
clock, how its PCIe link sits in the slot, persistence, ECC (the mode, and the volatile
counters, which stay 0 on a healthy GPU), retired pages (before Ampere), remapped rows
(Ampere and later) and the NVSwitch fabric's registration (Hopper). Utilization,
temperature, power draw, current clocks and the PCIe link's current generation (an idle GPU
lowers it) move, and are left out.

One line per field per GPU: "same", "differs: ours X, nvidia-smi Y", "missing: ..." (one
side has no value where the other has one, or neither has a value the GPU must have), or
"n/a on both" (a section this GPU does not have, e.g. retired pages on an H100). Exits 1
when any field differs or is missing, 2 when an input cannot be read, else 0.
"""

import argparse
import collections
import json
import sys
import xml.etree.ElementTree as ET

# What nvidia-smi writes where it has no value: the reading is absent, not a value.
ABSENT = {"", "N/A", "[N/A]", "Not Supported", "[Not Supported]", "Unknown Error", "[Unknown Error]",
          "Requested functionality has been deprecated", "Insufficient Permissions"}

MIB = 1024 * 1024


def text(element, path):
    """The text at `path` under `element`, stripped; None where nvidia-smi has no value."""
    found = element.find(path) if element is not None else None
    if found is None or found.text is None:
        return None
    value = found.text.strip()
    return None if value in ABSENT else value


def number_with_unit(value, unit):
    """The number of "81559 MiB" (81559), "16x" (16), "700.00 W" (700.0: a float where it has a point)."""
    if value is None:
        return None
    if not value.endswith(unit):
        raise ValueError(f"expected a value in {unit!r}, got {value!r}")
    number = value[: len(value) - len(unit)].strip()
    return float(number) if "." in number else int(number)


def enabled(value):
    """nvidia-smi's Enabled/Disabled and Yes/No as booleans."""
    if value is None:
        return None
    table = {"Enabled": True, "Disabled": False, "Yes": True, "No": False}
    if value not in table:
        raise ValueError(f"expected Enabled/Disabled or Yes/No, got {value!r}")
    return table[value]


def total(*values):
    """The sum of the counters nvidia-smi gives; None when it gives none of them."""
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def ecc_volatile(gpu):
    """(corrected, uncorrected) volatile ECC errors as nvidia-smi shows them. Drivers before
    R530 give totals per kind (single_bit/total, double_bit/total); later ones give counts per
    place (sram_*, dram_*; R550 splits SRAM's uncorrectable into _parity and _secded), whose
    sums are NVML's totals (nvmlDeviceGetTotalEccErrors, volatile)."""
    volatile = gpu.find("ecc_errors/volatile")
    if volatile is None:
        return None, None
    if volatile.find("single_bit") is not None:
        return (number_with_unit(text(volatile, "single_bit/total"), ""),
                number_with_unit(text(volatile, "double_bit/total"), ""))
    corrected, uncorrected = [], []
    for child in volatile:
        if child.tag.endswith("_correctable"):
            corrected.append(number_with_unit(text(volatile, child.tag), ""))
        elif "_uncorrectable" in child.tag:
            uncorrected.append(number_with_unit(text(volatile, child.tag), ""))
    return total(*corrected), total(*uncorrected)


def power_limit(gpu):
    """The enforced power limit: "Current Power Limit" under gpu_power_readings (R530 and
    later), "Enforced Power Limit" under power_readings before."""
    value = text(gpu, "gpu_power_readings/current_power_limit")
    if value is None:
        value = text(gpu, "power_readings/enforced_power_limit")
    return number_with_unit(value, "W")


def retired_pending(gpu):
    # "pending_retirement" (R450 and later) and its older name "pending_blacklist".
    value = text(gpu, "retired_pages/pending_retirement")
    return enabled(value if value is not None else text(gpu, "retired_pages/pending_blacklist"))


FABRIC_STATES = {"Not Started": "not_started", "In Progress": "in_progress", "Completed": "completed"}


def fabric_state(gpu):
    value = text(gpu, "fabric/state")
    return None if value is None else FABRIC_STATES.get(value, value)


# How a field is printed.
def plain(value):
    return str(value)


def mib(value):
    return f"{value} MiB"


def watts(value):
    return f"{value:.2f} W"


def mhz(value):
    return f"{value} MHz"


def lanes(value):
    return f"{value}x"


def on_off(value):
    return "Enabled" if value else "Disabled"


def yes_no(value):
    return "Yes" if value else "No"


# Readers of nvidia-smi's <gpu> element.
def smi_text(path):
    return lambda gpu: text(gpu, path)


def smi_number(path, unit=""):
    return lambda gpu: number_with_unit(text(gpu, path), unit)


def smi_flag(path):
    return lambda gpu: enabled(text(gpu, path))


def smi_retired_count(gpu):
    return total(number_with_unit(text(gpu, "retired_pages/multiple_single_bit_retirement/retired_count"), ""),
                 number_with_unit(text(gpu, "retired_pages/double_bit_retirement/retired_count"), ""))


def smi_fabric_status(gpu):
    # Meaningful only once the registration completed (NVML: "must be checked only if state
    # returns complete"); nvidia-smi prints NVML's error text, "Success" for none.
    return text(gpu, "fabric/status") if fabric_state(gpu) == "completed" else None


# Readers of top's GPU object: the value at a path of keys, None for null, absent or "".
def ours(*keys):
    def read(gpu):
        for key in keys:
            gpu = gpu.get(key) if isinstance(gpu, dict) else None
        return None if gpu == "" else gpu
    return read


def ours_mib(key):
    # nvidia-smi prints NVML's bytes divided by 2^20, rounded down.
    return lambda gpu: None if gpu.get(key) is None else gpu[key] // MIB


def ours_fabric_status(gpu):
    if ours("fabric", "state")(gpu) != "completed":
        return None
    return ours("fabric", "error")(gpu) or "Success"


# Each field: its name (nvidia-smi's XML path), whether every GPU has it (else it may be
# absent on both sides), how to read nvidia-smi's and top's value, and how to print one.
Field = collections.namedtuple("Field", "name required smi ours show")
LINK = "pci/pci_gpu_link_info/"
FIELDS = [
    Field("product_name", True, smi_text("product_name"), ours("name"), plain),
    Field("uuid", True, smi_text("uuid"), ours("uuid"), plain),
    Field("pci/pci_bus_id", True, smi_text("pci/pci_bus_id"), ours("pci_bus_id"), plain),
    Field("fb_memory_usage/total", True, smi_number("fb_memory_usage/total", "MiB"), ours_mib("memory_total"), mib),
    Field("fb_memory_usage/reserved", False, smi_number("fb_memory_usage/reserved", "MiB"),
          ours_mib("memory_reserved"), mib),
    Field("gpu_power_readings/current_power_limit", True, power_limit, ours("power_limit_w"), watts),
    Field("max_clocks/sm_clock", True, smi_number("max_clocks/sm_clock", "MHz"), ours("sm_clock_max_mhz"), mhz),
    Field(LINK + "pcie_gen/max_link_gen", True, smi_number(LINK + "pcie_gen/max_link_gen"),
          ours("pcie", "generation_max"), plain),
    Field(LINK + "pcie_gen/max_device_link_gen", False, smi_number(LINK + "pcie_gen/max_device_link_gen"),
          ours("pcie", "generation_gpu_max"), plain),
    Field(LINK + "link_widths/max_link_width", True, smi_number(LINK + "link_widths/max_link_width", "x"),
          ours("pcie", "width_max"), lanes),
    Field(LINK + "link_widths/current_link_width", True, smi_number(LINK + "link_widths/current_link_width", "x"),
          ours("pcie", "width"), lanes),
    Field("persistence_mode", False, smi_flag("persistence_mode"), ours("persistence_mode"), on_off),
    Field("ecc_mode/current_ecc", False, smi_flag("ecc_mode/current_ecc"), ours("ecc", "enabled"), on_off),
    Field("ecc_errors/volatile (corrected, summed)", False, lambda gpu: ecc_volatile(gpu)[0],
          ours("ecc", "corrected_volatile"), plain),
    Field("ecc_errors/volatile (uncorrected, summed)", False, lambda gpu: ecc_volatile(gpu)[1],
          ours("ecc", "uncorrected_volatile"), plain),
    Field("retired_pages/retired_count (single + double bit)", False, smi_retired_count,
          ours("retired_pages", "count"), plain),
    Field("retired_pages/pending_retirement", False, retired_pending, ours("retired_pages", "pending"), yes_no),
    Field("remapped_rows/remapped_row_corr", False, smi_number("remapped_rows/remapped_row_corr"),
          ours("remapped_rows", "correctable"), plain),
    Field("remapped_rows/remapped_row_unc", False, smi_number("remapped_rows/remapped_row_unc"),
          ours("remapped_rows", "uncorrectable"), plain),
    Field("remapped_rows/remapped_row_pending", False, smi_flag("remapped_rows/remapped_row_pending"),
          ours("remapped_rows", "pending"), yes_no),
    Field("remapped_rows/remapped_row_failure", False, smi_flag("remapped_rows/remapped_row_failure"),
          ours("remapped_rows", "failure"), yes_no),
    Field("fabric/state", False, fabric_state, ours("fabric", "state"), plain),
    Field("fabric/status", False, smi_fabric_status, ours_fabric_status, plain),
]


def compare_value(name, required, ours, theirs, show):
    """(verdict, line) for one field."""
    if ours is None and theirs is None:
        if required:
            return "missing", f"{name}: missing on both sides"
        return "n/a", f"{name}: n/a on both"
    if ours is None or theirs is None:
        side = "ours" if ours is None else "nvidia-smi"
        return "missing", (f"{name}: missing on {side}: ours {'-' if ours is None else show(ours)}, "
                           f"nvidia-smi {'-' if theirs is None else show(theirs)}")
    if isinstance(ours, float) or isinstance(theirs, float):
        # Watts: nvidia-smi prints NVML's milliwatts to two decimals; so do we.
        same = show(float(ours)) == show(float(theirs))
    else:
        same = ours == theirs
    if same:
        return "same", f"{name}: same ({show(ours)})"
    return "differs", f"{name}: differs: ours {show(ours)}, nvidia-smi {show(theirs)}"


def cuda_version(code):
    # NVML's 12040 is CUDA 12.4, as nvidia-smi's <cuda_version> prints it.
    return None if not code else f"{code // 1000}.{code % 1000 // 10}"


def last_sample(path):
    """The last sample with GPUs of `lockstep top --json` (one JSON object per line)."""
    source = sys.stdin if path == "-" else open(path)
    with source:
        samples = [json.loads(line) for line in source if line.strip().startswith("{")]
    samples = [s for s in samples if "gpus" in s]
    if not samples:
        raise ValueError(f"{path}: no `lockstep top --json` sample with GPUs in it")
    return samples[-1]


def compare(root, sample):
    """Every comparison's (verdict, line), in order."""
    results = [("system", *compare_value("driver_version", True, sample.get("driver_version") or None,
                                         text(root, "driver_version"), plain)),
               ("system", *compare_value("cuda_version", True, cuda_version(sample.get("cuda_driver_version")),
                                         text(root, "cuda_version"), plain))]
    smi_gpus = {(gpu.get("id") or "").upper(): gpu for gpu in root.findall("gpu")}
    ours_gpus = {(gpu.get("pci_bus_id") or "").upper(): gpu for gpu in sample["gpus"]}
    for bus_id, gpu in ours_gpus.items():
        label = f"gpu {gpu.get('index')} {bus_id}"
        theirs = smi_gpus.get(bus_id)
        if theirs is None:
            results.append((label, "missing", "not in nvidia-smi's report"))
            continue
        for field in FIELDS:
            try:
                smi_value = field.smi(theirs)
            except ValueError as error:
                results.append((label, "differs", f"{field.name}: nvidia-smi's value unreadable: {error}"))
                continue
            results.append((label, *compare_value(field.name, field.required, field.ours(gpu), smi_value,
                                                  field.show)))
    for bus_id in smi_gpus:
        if bus_id not in ours_gpus:
            results.append((f"gpu ? {bus_id}", "missing", "in nvidia-smi's report, not in ours"))
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--xml", required=True, help="nvidia-smi -q -x's output, a file or - for stdin")
    parser.add_argument("--top", required=True, help="lockstep top --json's output (its last sample is read)")
    args = parser.parse_args()
    if args.xml == "-" and args.top == "-":
        parser.error("only one of --xml and --top can be stdin")
    try:
        root = ET.parse(sys.stdin if args.xml == "-" else args.xml).getroot()
        if root.tag != "nvidia_smi_log":
            raise ValueError(f"{args.xml}: not nvidia-smi's XML (root <{root.tag}>, not <nvidia_smi_log>)")
        sample = last_sample(args.top)
    except (OSError, ValueError, ET.ParseError) as error:
        print(f"smi_xml_compare: {error}", file=sys.stderr)
        return 2
    results = compare(root, sample)
    counts = {"same": 0, "differs": 0, "missing": 0, "n/a": 0}
    for label, verdict, line in results:
        counts[verdict] += 1
        print(f"{label}  {line}")
    if not any(label.startswith("gpu ") and verdict != "missing" for label, verdict, _ in results):
        counts["missing"] += 1
        print("no GPU is on both sides")
    print(f"summary: {counts['same']} same, {counts['differs']} differ, {counts['missing']} missing, "
          f"{counts['n/a']} n/a on both")
    return 1 if counts["differs"] or counts["missing"] else 0


if __name__ == "__main__":
    sys.exit(main())
