"""Program formats, both ways: `.rasm` assembly text and `.rvmb` bytecode."""
