"""Package this directory as a VS Code extension (.vsix) with the standard library alone.

A .vsix is a zip holding [Content_Types].xml, extension.vsixmanifest and the extension's
files under extension/ (what `vsce package` writes, which needs the network to install).

    python3 editors/vscode/package.py [-o rvm-debug-0.1.0.vsix]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import stat
import sys
import zipfile
from xml.sax.saxutils import escape

HERE = pathlib.Path(__file__).resolve().parent
FILES = ["package.json", "language-configuration.json", "language-configuration-rasm.json",
         "syntaxes/janus.tmLanguage.json", "syntaxes/rasm.tmLanguage.json",
         "bin/rvm-dap", "bin/rvm-dap.cmd", "README.md"]

VSX = "http://schemas.microsoft.com/developer"
CONTENT_TYPES = """<?xml version="1.0" encoding="utf-8"?>
<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">
<Default Extension=".json" ContentType="application/json"/>
<Default Extension=".md" ContentType="text/markdown"/>
<Default Extension=".cmd" ContentType="application/octet-stream"/>
<Default Extension=".vsixmanifest" ContentType="text/xml"/>
<Override PartName="/extension/bin/rvm-dap" ContentType="application/octet-stream"/>
</Types>
"""


def manifest(pkg: dict) -> str:
    e = lambda key: escape(str(pkg.get(key, "")), {'"': "&quot;"})
    tags = escape(",".join(pkg.get("keywords", []) + ["debuggers", "janus", "rasm"]))
    return f"""<?xml version="1.0" encoding="utf-8"?>
<PackageManifest Version="2.0.0" xmlns="{VSX}/vsx-schema/2011"
                 xmlns:d="{VSX}/vsx-schema-design/2011">
  <Metadata>
    <Identity Language="en-US" Id="{e('name')}" Version="{e('version')}"
              Publisher="{e('publisher')}"/>
    <DisplayName>{e('displayName')}</DisplayName>
    <Description xml:space="preserve">{e('description')}</Description>
    <Tags>{tags}</Tags>
    <Categories>{escape(",".join(pkg.get("categories", [])))}</Categories>
    <GalleryFlags>Public</GalleryFlags>
    <Properties>
      <Property Id="Microsoft.VisualStudio.Code.Engine" Value="{escape(pkg['engines']['vscode'])}"/>
      <Property Id="Microsoft.VisualStudio.Code.ExtensionKind" Value="workspace"/>
    </Properties>
  </Metadata>
  <Installation>
    <InstallationTarget Id="Microsoft.VisualStudio.Code"/>
  </Installation>
  <Dependencies/>
  <Assets>
    <Asset Type="Microsoft.VisualStudio.Code.Manifest" Path="extension/package.json"
           Addressable="true"/>
    <Asset Type="Microsoft.VisualStudio.Services.Content.Details"
           Path="extension/README.md" Addressable="true"/>
  </Assets>
</PackageManifest>
"""


def build(out: pathlib.Path) -> pathlib.Path:
    pkg = json.loads((HERE / "package.json").read_text(encoding="utf-8"))
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("[Content_Types].xml", CONTENT_TYPES)
        z.writestr("extension.vsixmanifest", manifest(pkg))
        for name in FILES:
            path = HERE / name
            info = zipfile.ZipInfo(f"extension/{name}", (2024, 1, 1, 0, 0, 0))
            mode = 0o755 if os.access(path, os.X_OK) else 0o644
            info.external_attr = (stat.S_IFREG | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, path.read_bytes())
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="package editors/vscode as a .vsix")
    p.add_argument("-o", "--output", help="the .vsix to write (default: NAME-VERSION.vsix)")
    args = p.parse_args(argv)
    pkg = json.loads((HERE / "package.json").read_text(encoding="utf-8"))
    out = pathlib.Path(args.output or f"{pkg['name']}-{pkg['version']}.vsix")
    build(out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
