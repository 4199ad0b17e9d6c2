; The per-machine installer of vacancyd for Windows (docs/windows.md).
;
; Built with Debian's NSIS by `scripts/windows installer` (makensis defines
; VERSION, EXE and OUTFILE). It installs vacancyd.exe into Program Files and
; lets vacancyd itself do the rest, with the same commands an administrator
; would type: `service install` (LocalSystem, automatic start; it writes
; C:\ProgramData\vacancyd\vacancyd.toml only when that file is missing) and
; `service start` (the daemon creates C:\ProgramData\vacancyd\admission with
; its protected DACL, REC-24). So the installer holds no rule of its own about
; the recovery directory.
;
; An upgrade (this installer run over an installed one) stops the service,
; replaces the program and starts it again: the configuration and the
; recovery directory are never touched. Uninstalling stops and removes the
; service and the program, and KEEPS C:\ProgramData\vacancyd — the
; configuration and the recovery directory with any held work (REC-07).
;
; The tray (`vacancyd tray`) is registered for every user in HKLM's Run key,
; so it starts at each sign-in; the installer starts it for the user who
; installs (not when silent). Before the program is replaced or removed,
; every tray of this session is asked to close (they hold vacancyd.exe open);
; uninstalling removes the registration.
;
; Silent use: `vacancyd-setup.exe /S`, `uninstall.exe /S`.

; A 64-bit installer: vacancyd.exe is 64-bit, and so is the Wine it is
; tested under (no 32-bit Wine is installed there).
Target amd64-unicode
!include "LogicLib.nsh"

!ifndef VERSION | EXE | OUTFILE
  !error "makensis -DVERSION=x.y.z -DEXE=path\to\vacancyd.exe -DOUTFILE=setup.exe vacancyd.nsi"
!endif

!define UNINSTALL_KEY "Software\Microsoft\Windows\CurrentVersion\Uninstall\vacancyd"
!define RUN_KEY "Software\Microsoft\Windows\CurrentVersion\Run"
!define TRAY_VALUE "vacancyd tray"
; The tray's hidden window class (vacancy_win32::tray::TRAY_CLASS).
!define TRAY_CLASS "vacancyd-tray"
!define WM_CLOSE 0x0010

Name "vacancyd ${VERSION}"
OutFile "${OUTFILE}"
InstallDir "$PROGRAMFILES64\vacancyd"
RequestExecutionLevel admin
SetCompressor /SOLID lzma
ShowInstDetails show
ShowUninstDetails show

Page directory
Page instfiles
UninstPage uninstConfirm
UninstPage instfiles

; Ask every tray window of this session to close, and wait (5 s at most)
; until none is left: a running tray holds vacancyd.exe open.
!macro CLOSE_TRAYS un
Function ${un}CloseTrays
  StrCpy $1 0
  loop:
    FindWindow $0 "${TRAY_CLASS}"
    StrCmp $0 0 done
    SendMessage $0 ${WM_CLOSE} 0 0 /TIMEOUT=2000
    Sleep 100
    IntOp $1 $1 + 1
    IntCmp $1 50 done loop done
  done:
FunctionEnd
!macroend
!insertmacro CLOSE_TRAYS ""
!insertmacro CLOSE_TRAYS "un."

Function .onInit
  SetRegView 64
  ; Over an installed vacancyd, install where it is.
  ReadRegStr $0 HKLM "${UNINSTALL_KEY}" "InstallLocation"
  ${If} $0 != ""
    StrCpy $INSTDIR $0
  ${EndIf}
FunctionEnd

Section "vacancyd"
  SetRegView 64
  ; An upgrade: the running service lets go of its program first. Open work
  ; gets the graceful stop's 30 s; what is still open is held, not lost.
  ${If} ${FileExists} "$INSTDIR\vacancyd.exe"
    DetailPrint "stopping the running vacancyd service"
    ExecWait '"$INSTDIR\vacancyd.exe" service stop' $0
  ${EndIf}

  Call CloseTrays

  SetOutPath "$INSTDIR"
  File "/oname=vacancyd.exe" "${EXE}"
  File "/oname=README.md" "../../README.md"
  File "/oname=windows.md" "../../docs/windows.md"
  File "/oname=vacancyd.example.toml" "vacancyd.toml"
  WriteUninstaller "$INSTDIR\uninstall.exe"

  ; Registered once; an upgrade keeps the registration (and its --config).
  ExecWait '"$INSTDIR\vacancyd.exe" service status' $0
  ${If} $0 != 0
    DetailPrint "registering the vacancyd service"
    ExecWait '"$INSTDIR\vacancyd.exe" service install' $0
    ${If} $0 != 0
      Abort "vacancyd could not register its service (exit $0); run $\"$INSTDIR\vacancyd.exe$\" service install as administrator to see why"
    ${EndIf}
  ${EndIf}
  DetailPrint "starting the vacancyd service"
  ExecWait '"$INSTDIR\vacancyd.exe" service start' $0
  ${If} $0 != 0
    ; Installed, not running: usually a configuration to fix. Say where.
    DetailPrint "the vacancyd service did not start (exit $0): check C:\ProgramData\vacancyd\vacancyd.toml with $\"$INSTDIR\vacancyd.exe$\" check-config, then start it with service start"
  ${EndIf}

  ; The tray, for every user at sign-in; now for the one installing.
  WriteRegStr HKLM "${RUN_KEY}" "${TRAY_VALUE}" '"$INSTDIR\vacancyd.exe" tray'
  ${IfNot} ${Silent}
    Exec '"$INSTDIR\vacancyd.exe" tray'
  ${EndIf}

  WriteRegStr HKLM "${UNINSTALL_KEY}" "DisplayName" "vacancyd"
  WriteRegStr HKLM "${UNINSTALL_KEY}" "DisplayVersion" "${VERSION}"
  WriteRegStr HKLM "${UNINSTALL_KEY}" "Publisher" "vacancy"
  WriteRegStr HKLM "${UNINSTALL_KEY}" "InstallLocation" "$INSTDIR"
  WriteRegStr HKLM "${UNINSTALL_KEY}" "UninstallString" '"$INSTDIR\uninstall.exe"'
  WriteRegStr HKLM "${UNINSTALL_KEY}" "QuietUninstallString" '"$INSTDIR\uninstall.exe" /S'
  WriteRegDWORD HKLM "${UNINSTALL_KEY}" "NoModify" 1
  WriteRegDWORD HKLM "${UNINSTALL_KEY}" "NoRepair" 1
SectionEnd

Function un.onInit
  SetRegView 64
FunctionEnd

Section "Uninstall"
  ; Stops the service (gracefully) and removes it; vacancyd's own command
  ; keeps the configuration and the recovery directory.
  DeleteRegValue HKLM "${RUN_KEY}" "${TRAY_VALUE}"
  Call un.CloseTrays
  ExecWait '"$INSTDIR\vacancyd.exe" service uninstall' $0
  ${If} $0 != 0
    DetailPrint "vacancyd service uninstall exited $0 (no service registered, or it could not be stopped)"
  ${EndIf}
  Delete "$INSTDIR\vacancyd.exe"
  Delete "$INSTDIR\README.md"
  Delete "$INSTDIR\windows.md"
  Delete "$INSTDIR\vacancyd.example.toml"
  Delete "$INSTDIR\uninstall.exe"
  RMDir "$INSTDIR"
  DeleteRegKey HKLM "${UNINSTALL_KEY}"
  DetailPrint "kept C:\ProgramData\vacancyd: the configuration and the recovery directory (delete it by hand only when no work is held)"
SectionEnd
