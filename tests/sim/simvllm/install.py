"""A simulated vLLM installation of one release, laid out as pip lays out vLLM in a virtual environment.

`python -m simvllm.install DIR VERSION [--python PYTHON]` (or `install(DIR, VERSION, PYTHON)`) writes:
- DIR/bin/vllm: the console script, running the simulated vLLM as VERSION (it sets SIMVLLM_VERSION for the server
  and the processes it starts, whatever the environment says: the code installed decides the release);
- DIR/lib/pythonX.Y/site-packages/vllm-VERSION.dist-info/METADATA: the package metadata (Metadata-Version, Name,
  Version) that `importlib.metadata.version("vllm")` reads and that real vLLM's `vllm --version` prints.
PYTHON (default: this interpreter) runs the script; it needs simvllm's own imports, which the script adds.
"""

import argparse
import os
import sys

SIM_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def install(directory, version, python=None):
    """Write the installation; returns the path of its bin/vllm."""
    python = python or sys.executable
    site = os.path.join(
        directory, "lib", "python%d.%d" % sys.version_info[:2], "site-packages", "vllm-%s.dist-info" % version
    )
    os.makedirs(site, exist_ok=True)
    with open(os.path.join(site, "METADATA"), "w") as metadata:
        metadata.write("Metadata-Version: 2.4\nName: vllm\nVersion: %s\nRequires-Python: >=3.10\n\n" % version)
    with open(os.path.join(site, "INSTALLER"), "w") as installer:
        installer.write("pip\n")
    os.makedirs(os.path.join(directory, "bin"), exist_ok=True)
    script = os.path.join(directory, "bin", "vllm")
    with open(script, "w") as handle:
        handle.write(
            "#!%s\n"
            "import os\n"
            "import sys\n"
            "os.environ['SIMVLLM_VERSION'] = %r\n"
            "sys.path.insert(0, %r)\n"
            "from simvllm.cli import main\n"
            "sys.exit(main())\n" % (python, version, SIM_DIR)
        )
    os.chmod(script, 0o755)
    return script


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m simvllm.install", description=__doc__.split("\n", 1)[0])
    parser.add_argument("directory")
    parser.add_argument("version")
    parser.add_argument("--python")
    args = parser.parse_args(argv)
    print(install(args.directory, args.version, args.python))
    return 0


if __name__ == "__main__":
    sys.exit(main())
